"""The step executor: runs step plans (verifier_service/step/plan.py) on the target's device with
one copy in, one copy out and one wait per step.

    copy in    the plan's one host buffer -> the device (non-blocking; from pinned memory on
               accelerators)
    body       the target's forward over the plan's arrays (ModelRunner.run_plan: paged
               attention reading block tables on the device), every logits row's argmax, and
               greedy chain verification (kernels.rejection.greedy_chain_verify): no host sync
    [sampler]  sampled requests and trees: the rejection samplers, launched eagerly after the
               body, still without a sync (their host-side choices come from the StepLayout)
    copy out   `fetch`: everything the host needs, packed into one int32 buffer, one
               non-blocking copy into pinned memory, then the step's one event wait

On a device with graphs (CUDA; an MLU through the same seam, splitspec/device.py) the body of
every bucket of the ladder is captured once at start-up (`capture`), largest first, into one
shared memory pool, and a bucket step replays its graph over static device buffers: a decode
step costs one replay instead of ~175 launches. Steps outside the ladder (prefill chunks, trees
over 64 nodes) run the same body eagerly at their exact shape; on a capturing device each such
step is counted by reason (`stats`) and logged once per reason and shape, never silent. On the
CPU every step runs eagerly at its exact shape (the CPU's ladder is empty: a padding row would
cost real compute), over the same arrays and the same body.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch

from kernels.layout import StepLayout
from kernels.rejection import greedy_chain_verify
from splitspec import device as dev
from splitspec.graphs import EagerFallbacks
from verifier_service.step.plan import Bucket, BucketLadder, StepPlan, plan_step
from verifier_service.step.sampler import StepSampler
from verifier_service.step.sampling_state import SamplingState

__all__ = ["ExecutorStats", "StepExecutor", "StepTensors"]

log = logging.getLogger(__name__)

# why a step ran eagerly on a device that captures (a metric label each)
PREFILL = "prefill"  # the step feeds prompt rows (not every sequence is decoding)
NO_BUCKET = "no_bucket"  # more sequences, rows or tree nodes than the ladder's largest bucket
NOT_CAPTURED = "not_captured"  # the bucket's capture failed at start-up
NO_LEAN = "model_without_lean_forward"  # the transformers forward: never captured
EAGER_REASONS = (PREFILL, NO_BUCKET, NOT_CAPTURED, NO_LEAN)


@dataclass
class StepTensors:
    """One step's results on the device (nothing copied to the host yet)."""

    logits: torch.Tensor  # [L, V] float32: the plan's logits rows
    hidden: torch.Tensor  # [L, H]: the final-norm hidden states they came from
    argmax: torch.Tensor  # [L]
    tokens: torch.Tensor  # [S, K + 1]: greedy chain verification (PLACEHOLDER padded)
    num_accepted: torch.Tensor  # [S]
    views: dict = field(default_factory=dict)  # the plan's arrays on the device
    # [T, F]: every fed row's features, where a head on the target's features asks
    # (ModelRunner.feature_layers); None otherwise
    features: torch.Tensor | None = None


@dataclass
class ExecutorStats:
    """Counters of what ran how (verifier_service/telemetry/metrics.py exports them)."""

    captured_steps: int = 0
    captured_tokens: int = 0  # real fed rows of captured steps (padding excluded)
    bucket_steps: int = 0  # steps run at a bucket's padded shape (captured or not)
    eager_steps: Counter = field(default_factory=Counter)  # reason -> steps ("" : no graphs)
    eager_tokens: Counter = field(default_factory=Counter)
    graphs: int = 0
    capture_seconds: float = 0.0
    graph_pool_bytes: int = 0  # device memory the graphs hold (beside the KV cache)
    # steps with nothing to verify and a sampled row, through the step sampler: "captured"
    # (its graph replayed) or "eager" (its body, no graph for the bucket)
    sampler_steps: Counter = field(default_factory=Counter)

    @property
    def captured_share(self) -> float:
        steps = self.captured_steps + sum(self.eager_steps.values())
        return self.captured_steps / steps if steps else 0.0


def _patch(flat: torch.Tensor, plan) -> None:
    """The plan's device-held values over its copied arrays (StepPlan.device_ids: at an offset,
    or at host indices; a plan another tensor-parallel rank received has none: with ranks,
    drafts are read back first)."""
    for at, values in getattr(plan, "device_ids", ()):
        if isinstance(at, int):
            flat[at:at + values.shape[0]].copy_(values)
        else:
            flat.index_copy_(0, at.to(flat.device, non_blocking=True), values)


@dataclass
class _Graph:
    graph: object
    out: StepTensors


class StepExecutor:
    def __init__(self, runner, ladder: BucketLadder | None = None, capture: bool = False):
        """runner: verifier_service.model.runner.ModelRunner (or anything with its `run_plan`,
        `kv`, `device`, `max_model_len`). ladder: the bucket shapes (None or empty: every step
        at its exact shape). capture: record a graph per bucket (`capture()`), where the device
        supports graphs and the model runs the lean forward."""
        self.runner = runner
        self.device = runner.device
        self.kv = runner.kv
        self.ladder = ladder or BucketLadder()
        self.stats = ExecutorStats()
        self.graphs_wanted = (capture and not self.ladder.exact
                              and dev.supports_graphs(self.device))
        self._no_lean = self.graphs_wanted and not getattr(runner, "lean", True)
        # a bucket's block tables are as wide as the longest context served
        self.max_blocks = -(-runner.max_model_len // self.kv.block_size)
        self._graphs: dict[Bucket, _Graph] = {}
        self._pool = None
        self._static: torch.Tensor | None = None  # device buffer the graphs read
        # two host staging buffers in turn: a plan may be written while the last one's copy
        # is still in flight (pinned on accelerators, so the copy does not wait)
        self._staging = [dev.pinned_empty(1 << 14, torch.int64, self.device) for _ in range(2)]
        self._turn = 0
        self._fetch = dev.HostFetch(self.device)
        # a step that verifies nothing where a row samples: its sampler replayed too
        self.sampler = StepSampler(self.device, getattr(runner, "vocab_size", 1),
                                   max(self.ladder.seqs, default=1), enabled=self.graphs_wanted,
                                   counts=self.stats.sampler_steps)
        # every running sequence's sampling fields, expanded once per step to its rows
        self.sampling = SamplingState(getattr(runner, "vocab_size", 1), self.device)
        self.logprobs_mode = "processed_logprobs"  # or raw_logprobs (VerifierConfig)
        # eager steps on a device that captures: counted by reason, logged once per shape
        self.fallbacks = EagerFallbacks(f"a step on {self.device}", self.stats.eager_steps)
        # tensor parallel, rank 0 (verifier_service/tp/broadcast.py): every plan, and every
        # capture, is sent to the other ranks first; they run the same body on their shards
        self.broadcast = None

    @classmethod
    def for_config(cls, runner, config) -> "StepExecutor":
        """The executor a verifier runs (verifier_service/config.py): on a device with graphs a
        ladder up to max_num_seqs x (1 + max_num_speculative_tokens), else exact shapes."""
        rows = 1 + config.max_num_speculative_tokens
        graphs = config.graphs != "off" and dev.supports_graphs(runner.device)
        ladder = (BucketLadder.powers_of_two(config.max_num_seqs, rows) if graphs
                  else BucketLadder())
        executor = cls(runner, ladder, capture=graphs)
        executor.logprobs_mode = config.logprobs_mode
        return executor

    # -- planning ----------------------------------------------------------------------------

    def plan(self, layout: StepLayout, input_ids, tables) -> StepPlan:
        """The step's plan (host only), in the next staging buffer."""
        self._turn ^= 1
        out = self._staging[self._turn]
        plan = plan_step(layout, input_ids, tables, self.kv.block_size, self.kv.trash_block,
                         self.ladder, self.max_blocks, out)
        if plan.host.data_ptr() != out.data_ptr():  # outgrew the staging buffer: grow it
            self._staging[self._turn] = dev.pinned_empty(2 * plan.host.numel(), torch.int64,
                                                         self.device)
            self._staging[self._turn][:plan.host.numel()].copy_(plan.host)
            plan.host = self._staging[self._turn][:plan.host.numel()]
        return plan

    # -- running -----------------------------------------------------------------------------

    def execute(self, plan: StepPlan) -> StepTensors:
        """Launch the step (replay its bucket's graph, or run the body eagerly); returns its
        device tensors without waiting for them."""
        if self.broadcast is not None:
            self.broadcast.step(plan)
        real = plan.layout.num_tokens
        self.stats.bucket_steps += plan.bucket is not None
        if plan.bucket in self._graphs:
            self.stats.captured_steps += 1
            self.stats.captured_tokens += real
            return self.launch(plan)
        reason = self._eager_reason(plan)
        self.stats.eager_tokens[reason] += real
        if reason:
            self.fallbacks.record(reason, rows=plan.num_tokens, bucket=plan.bucket)
        else:  # this device has no graphs: nothing fell back
            self.stats.eager_steps[reason] += 1
        return self.launch(plan)

    def launch(self, plan: StepPlan) -> StepTensors:
        """Replay the plan's bucket graph, or run the body eagerly over its arrays, counting
        nothing: what execute() runs, and what the other ranks of a tensor-parallel verifier
        run for the plans rank 0 sends them (verifier_service/tp/worker.py)."""
        graph = self._graphs.get(plan.bucket) if plan.bucket is not None else None
        if graph is not None:
            self._static[:plan.host.numel()].copy_(plan.host, non_blocking=True)
            _patch(self._static, plan)
            graph.graph.replay()
            return graph.out
        flat = (plan.host if self.device.type == "cpu"
                else plan.host.to(self.device, non_blocking=True))
        _patch(flat, plan)
        return self.body(plan.fields.views(flat), plan)

    def _eager_reason(self, plan: StepPlan) -> str:
        """Why a step is not replayed ("": this device does not capture)."""
        if not self.graphs_wanted:
            return ""
        if self._no_lean:
            return NO_LEAN
        if plan.bucket is not None:
            return NOT_CAPTURED
        layout = plan.layout
        decoding = bool((layout.query_lens[layout.seq_index]
                         - layout.num_draft_tokens == 1).all()) and \
            layout.batch_size == layout.num_seqs
        return NO_BUCKET if decoding else PREFILL

    def body(self, views: dict, plan: StepPlan) -> StepTensors:
        """The step on the device, with no host sync: what a graph records."""
        out = {} if getattr(self.runner, "feature_layers", None) is not None else None
        logits, hidden = self.runner.run_plan(views, plan, out)
        argmax = logits.argmax(dim=-1)
        tokens, num_accepted = greedy_chain_verify(argmax, views["draft_ids"],
                                                   views["draft_valid"], views["target_idx"],
                                                   views["bonus_base"])
        return StepTensors(logits, hidden, argmax, tokens, num_accepted, views,
                           out.get("features") if out is not None else None)

    def fetch(self, ints: list[torch.Tensor], floats: list[torch.Tensor] = ()
              ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The host's copy of device tensors: int64 arrays of `ints` (token ids, counts,
        indices) and float32 arrays of `floats`, in one packed non-blocking copy and the step's
        one wait (splitspec.device.HostFetch). On the CPU: the tensors themselves."""
        return self._fetch(ints, floats)

    # -- capture -------------------------------------------------------------------------------

    def capture(self) -> None:
        """Record one graph per bucket of the ladder (largest first, one memory pool), each
        after two eager runs that settle lazy setup (Triton compilation, allocator growth).
        A bucket whose capture fails is logged and runs eagerly (counted as not_captured)."""
        if not self.graphs_wanted or self._no_lean:
            if self._no_lean:
                log.warning("the target has no lean forward: no step is captured "
                            "(every step runs eagerly)")
            return
        if self.broadcast is not None:
            self.broadcast.capture()
        device = self.device
        start = time.perf_counter()
        before = torch.cuda.memory_reserved(device) if device.type == "cuda" else 0
        biggest = max(plan_step(StepLayout.build([], [], [], []), [], [], self.kv.block_size,
                                self.kv.trash_block, max_blocks=self.max_blocks,
                                bucket=b).fields.total for b in self.ladder)
        self._static = torch.zeros(biggest, dtype=torch.int64, device=device)
        self._pool = dev.graph_pool(device)
        stream = dev.new_stream(device)
        for bucket in self.ladder:
            plan = plan_step(StepLayout.build([], [], [], []), [], [], self.kv.block_size,
                             self.kv.trash_block, max_blocks=self.max_blocks, bucket=bucket)
            self._static[:plan.host.numel()].copy_(plan.host)
            views = plan.fields.views(self._static)
            try:
                stream.wait_stream(dev.current_stream(device))
                with dev.use_stream(device, stream):
                    for _ in range(2):
                        self.body(views, plan)
                dev.current_stream(device).wait_stream(stream)
                graph = dev.new_graph(device)
                with torch.inference_mode(), dev.capture(device, graph, self._pool, stream):
                    out = self.body(views, plan)
                self._graphs[bucket] = _Graph(graph, out)
            except Exception:  # noqa: BLE001 - one bucket's failure must not stop the server
                log.exception("capturing bucket %s failed: it runs eagerly", bucket)
        self.sampler.capture(self._pool, stream)
        dev.synchronize(device)
        self.stats.graphs = len(self._graphs)
        self.stats.capture_seconds = time.perf_counter() - start
        if device.type == "cuda":
            self.stats.graph_pool_bytes = torch.cuda.memory_reserved(device) - before
        log.info("captured %d step graphs (buckets %s) in %.1f s, %.1f MiB of device memory",
                 len(self._graphs), ", ".join(str(b) for b in self.ladder),
                 self.stats.capture_seconds, self.stats.graph_pool_bytes / 2**20)

    @property
    def captured_buckets(self) -> list[Bucket]:
        return sorted(self._graphs)
