"""The verifier's engine: admits requests, asks proposers for drafts, verifies them in one target
forward, and streams the accepted tokens.

One step (see docs/architecture.md):
  1. the scheduler admits waiting requests while KV blocks allow and reserves each running
     sequence's slots for this step (preempting the youngest when blocks run out);
  2. per proposer, one message carrying every speculating sequence's new tokens and k, sent
     concurrently and awaited until the per-step deadline;
  3. one target forward over the packed ragged batch: [uncached tokens..., d1..dk] per sequence;
  4. the rejection sampler (kernels/) keeps an accepted prefix plus one recovered or bonus token;
  5. rollback of rejected slots (emptied blocks are freed), detokenization, stop checks,
     streaming.
A proposer that is late, gone or wrong costs only speculation: its sequences decode plainly.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import AsyncIterator

import torch

from kernels.rejection import SparseProbs, rejection_sample
from kernels.sampling import SamplingTensors
from splitspec.device import make_generator
from splitspec.errors import InvalidArgument
from splitspec.params import GenerationInput
from splitspec.proposal import Draft, SequenceStep
from verifier_service.config import VerifierConfig
from verifier_service.model_runner import ModelRunner, SeqForward
from verifier_service.output import OutputTracker
from verifier_service.proposer_client import ProposerClient
from verifier_service.scheduler import Scheduled, Scheduler
from verifier_service.sequence import Sequence, StepOutput

log = logging.getLogger(__name__)


@dataclass
class MethodStats:
    proposed_tokens: int = 0  # counters, monotonically increasing
    accepted_tokens: int = 0
    steps: int = 0
    missed_steps: int = 0  # no usable answer before the deadline


@dataclass
class EngineStats:
    """Counters since start (monotonic) plus gauges filled in by Engine.snapshot()."""

    steps: int = 0
    generated_tokens: int = 0
    finished_requests: int = 0
    aborted_requests: int = 0
    per_method: dict[str, MethodStats] = field(default_factory=dict)
    preemptions: int = 0
    step_seconds_total: float = 0.0
    running: int = 0
    waiting: int = 0
    kv_blocks_total: int = 0
    kv_blocks_free: int = 0


@dataclass
class _Proposal:
    tokens: list[int]
    distributions: list | None = None  # kernels-ready sparse rows, or None for one-hot


class Engine:
    def __init__(self, config: VerifierConfig, runner: ModelRunner, tokenizer,
                 proposers: dict[str, ProposerClient], eos_token_ids: set[int],
                 max_model_len: int):
        self.config = config
        self.runner = runner
        self.tokenizer = tokenizer
        self.proposers = proposers
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.stats = EngineStats()
        self.scheduler = Scheduler(runner.kv, config.max_num_seqs, config.max_waiting,
                                   config.max_num_batched_tokens)
        self._by_id: dict[str, Sequence] = {}
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="model")
        self._task: asyncio.Task | None = None

    # -- public API ------------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    def snapshot(self) -> EngineStats:
        s = self.stats
        s.running, s.waiting = self.num_running, self.num_waiting
        s.preemptions = self.scheduler.num_preemptions
        s.kv_blocks_total = self.runner.kv.num_blocks
        s.kv_blocks_free = self.runner.kv.num_free_blocks
        return s

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="engine-loop")

    async def shutdown(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for seq in list(self._by_id.values()):
            self._finish(seq, "abort")
        self._executor.shutdown(wait=False)

    async def generate(self, inp: GenerationInput) -> AsyncIterator[StepOutput]:
        """Stream a request's outputs; leaving early (client gone) aborts it."""
        seq = self.add_request(inp)
        try:
            while True:
                item = await seq.outputs.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finish_reason is not None:
                    return
        finally:
            if not seq.finished:
                self.abort(seq.request_id)

    def add_request(self, inp: GenerationInput) -> Sequence:
        if not inp.prompt_token_ids:
            raise InvalidArgument("prompt", "must not be empty")
        vocab = self.runner.vocab_size
        if any(not 0 <= t < vocab for t in inp.prompt_token_ids):
            raise InvalidArgument("prompt", f"token ids must be in [0, {vocab})")
        n = len(inp.prompt_token_ids)
        if n + inp.stopping.max_tokens > self.max_model_len:
            raise InvalidArgument(
                "max_tokens", f"prompt ({n} tokens) + max_tokens ({inp.stopping.max_tokens}) "
                f"exceeds the model's context length ({self.max_model_len})")
        kv = self.runner.kv
        if kv.blocks_for(n + inp.stopping.max_tokens) > kv.num_blocks:
            raise InvalidArgument(
                "max_tokens", f"prompt ({n} tokens) + max_tokens ({inp.stopping.max_tokens}) "
                f"exceeds the KV cache ({kv.num_blocks * kv.block_size} tokens)")
        if inp.speculation.enabled and inp.speculation.method not in self.proposers:
            raise InvalidArgument("speculation.method",
                                  f"{inp.speculation.method!r} is not served here")
        request_id = inp.request_id or uuid.uuid4().hex
        if request_id in self._by_id:
            raise InvalidArgument("request_id", f"{request_id!r} is already in use")
        if request_id != inp.request_id:
            inp = GenerationInput(request_id, inp.prompt_token_ids, inp.sampling, inp.stopping,
                                  inp.speculation)
        seed = inp.sampling.seed
        seq = Sequence(
            inp=inp,
            tracker=OutputTracker(self.tokenizer, list(inp.prompt_token_ids), inp.stopping,
                                  self.eos_token_ids, inp.stopping.max_tokens),
            generator=None if seed is None else make_generator(self.runner.device, seed))
        self.scheduler.add(seq)
        self._by_id[request_id] = seq
        self._wakeup.set()
        return seq

    def abort(self, request_id: str) -> bool:
        seq = self._by_id.get(request_id)
        if seq is None or seq.finished:
            return False
        seq.aborted = True
        self._wakeup.set()
        return True

    # -- the loop ----------------------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            self._reap_aborted()
            if not self.scheduler.running and not self.scheduler.waiting:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            try:
                await self.step()
            except Exception as exc:  # noqa: BLE001 - never let the loop die silently
                log.exception("engine step failed outside the model call")
                for seq in list(self.scheduler.running):
                    self._fail(seq, exc)

    def _reap_aborted(self) -> None:
        for seq in [s for s in self._by_id.values() if s.aborted and not s.finished]:
            self._finish(seq, "abort")

    async def step(self) -> None:
        start = time.perf_counter()
        plan = self.scheduler.schedule(self._draft_budget)
        if not plan:
            return
        try:
            await self._run_step(plan)
        finally:
            self.stats.step_seconds_total += time.perf_counter() - start

    async def _run_step(self, plan: list[Scheduled]) -> None:
        proposals = await self._collect_proposals(plan)
        batch = [s for s in plan if not s.seq.finished]  # aborted while proposers answered
        if not batch:
            return
        loop = asyncio.get_running_loop()
        try:
            results = await loop.run_in_executor(
                self._executor, self._verify, batch, [proposals.get(s.seq) for s in batch])
        except Exception as exc:  # noqa: BLE001 - a failed step fails its requests, not the server
            log.exception("engine step failed")
            for s in batch:
                self._fail(s.seq, exc)
            return
        self.stats.steps += 1
        for s, result in zip(batch, results):
            if result is None:  # a prefill chunk: cached, nothing to emit yet
                s.seq.num_computed += s.num_new
                continue
            row, n_acc = result
            self._apply(s.seq, proposals.get(s.seq), row[:n_acc + 1], n_acc)

    # -- proposals -----------------------------------------------------------------------------

    def _draft_budget(self, seq: Sequence) -> int:
        plan = seq.inp.speculation
        if not plan.enabled:
            return 0
        remaining = seq.inp.stopping.max_tokens - len(seq.tracker.output_ids)
        room = self.max_model_len - len(seq.tokens)
        # A step emits accepted drafts + 1 token: drafting more than needed is wasted work.
        return max(0, min(plan.k, remaining - 1, room - 1, self.config.max_num_speculative_tokens))

    async def _collect_proposals(self, plan: list[Scheduled]) -> dict[Sequence, _Proposal]:
        by_method: dict[str, list[tuple[Sequence, int]]] = {}
        for s in plan:
            if s.k > 0:
                by_method.setdefault(s.seq.inp.speculation.method, []).append((s.seq, s.k))
        for method, client in self.proposers.items():
            if method not in by_method:
                await client.flush_released()
        results = await asyncio.gather(*(self._ask(self.proposers[m], group)
                                         for m, group in by_method.items()))
        merged: dict[Sequence, _Proposal] = {}
        for r in results:
            merged.update(r)
        return merged

    async def _ask(self, client: ProposerClient,
                   group: list[tuple[Sequence, int]]) -> dict[Sequence, _Proposal]:
        stats = self.stats.per_method.setdefault(client.method, MethodStats())
        stats.steps += 1
        if not await client.ensure_connected():
            stats.missed_steps += 1
            return {}
        steps, wanted = [], {}
        needs_hidden = client.description is not None and client.description.needs_hidden_state
        for seq, k in group:
            seq.wants_hidden = needs_hidden
            if needs_hidden and seq.last_hidden is None:
                continue  # before the first verification there is no hidden state yet
            full = seq.proposer_epoch != client.epoch
            new = seq.tokens if full else seq.tokens[seq.proposer_heard:]
            steps.append(SequenceStep(seq.request_id, list(new), len(seq.tokens), k,
                                      full_history=full, sampling=seq.inp.sampling,
                                      hidden_state=seq.last_hidden if needs_hidden else None))
            wanted[seq.request_id] = (seq, k)
            seq.proposer_heard, seq.proposer_epoch = len(seq.tokens), client.epoch
        if not steps:
            return {}
        drafts = await client.propose(steps, self.config.proposer_timeout_ms / 1000)
        if drafts is None:
            stats.missed_steps += 1
            return {}
        out: dict[Sequence, _Proposal] = {}
        for d in drafts:
            if d.seq_id not in wanted:
                continue
            seq, k = wanted.pop(d.seq_id)
            if d.resync:
                seq.proposer_epoch = -1  # full history on the next step
                continue
            proposal = self._sanitize(d, k)
            if proposal is not None and proposal.tokens:
                out[seq] = proposal
        return out

    def _sanitize(self, d: Draft, k: int) -> _Proposal | None:
        """Never trust a proposer: wrong lengths, unknown ids or bad distributions drop the
        draft (the step then decodes that sequence plainly)."""
        vocab = self.runner.vocab_size
        if len(d.tokens) > k or any(not 0 <= t < vocab for t in d.tokens):
            return None
        if d.distributions is None:
            return _Proposal(list(d.tokens))
        if len(d.distributions) != len(d.tokens):
            return None
        rows = []
        for tok, dist in zip(d.tokens, d.distributions):
            idx = torch.tensor(dist.indices, dtype=torch.long)
            p = torch.tensor(dist.probs, dtype=torch.float32)
            if (idx.numel() == 0 or idx.shape != p.shape or (idx < 0).any() or (idx >= vocab).any()
                    or not torch.isfinite(p).all() or (p < 0).any()
                    or abs(float(p.sum()) - 1.0) > 1e-3):
                return None
            hit = (idx == tok).nonzero()
            if hit.numel() == 0 or p[hit[0, 0]] <= 0:
                return None  # the draft token cannot have been sampled from this q
            rows.append((idx, p / p.sum()))
        return _Proposal(list(d.tokens), rows)

    # -- verification (runs on the model thread) --------------------------------------------

    def _verify(self, batch: list[Scheduled], proposals: list[_Proposal | None]
                ) -> list[tuple[list[int], int] | None]:
        """Forward the whole batch, then rejection-sample the sequences that emit this step.
        Per batch entry: (output row, accepted count), or None for a prefill chunk."""
        device = self.runner.device
        work = []
        for s, prop in zip(batch, proposals):
            nc = s.seq.num_computed
            d = prop.tokens if prop else []
            work.append(SeqForward(s.seq.blocks, s.seq.tokens[nc:nc + s.num_new] + d, nc,
                                   len(d) + 1 if s.samples else 0))
        outs = self.runner.forward(work)
        emit = [i for i, s in enumerate(batch) if s.samples]
        results: list[tuple[list[int], int] | None] = [None] * len(batch)
        if not emit:
            return results
        seqs = [batch[i].seq for i in emit]
        props = [proposals[i] for i in emit]
        ks = [len(p.tokens) if p else 0 for p in props]
        logits = torch.cat([outs[i][0] for i in emit])  # [T, V], T = sum(k_i + 1)
        params = [s.inp.sampling for s in seqs]
        rows = [k + 1 for k in ks]  # logits rows per sequence

        def per_row(values):  # one value per sequence -> one per logits row
            return [v for v, n in zip(values, rows) for _ in range(n)]

        probs = SamplingTensors.from_lists(  # host tensors: the kernel picks its fast paths
            per_row([p.temperature for p in params]), per_row([p.top_k for p in params]),
            per_row([p.top_p for p in params]), per_row([p.min_p for p in params])).apply(logits)
        drafts = [t for p in props if p for t in p.tokens]
        result = rejection_sample(
            probs, torch.tensor(drafts, dtype=torch.long, device=device),
            torch.tensor(ks, dtype=torch.long), self._draft_probs(props, ks, device),
            torch.tensor([p.greedy for p in params], dtype=torch.bool),  # host: decides draws
            [s.generator for s in seqs])
        out_rows = result.output_token_ids.tolist()
        num_accepted = result.num_accepted.tolist()
        for i, seq, row, n_acc in zip(emit, seqs, out_rows, num_accepted):
            if seq.wants_hidden:
                # The state that produced this step's last token: the MLP speculator's input.
                seq.last_hidden = outs[i][1][n_acc].detach().to("cpu", torch.float32)
            results[i] = (row, n_acc)
        return results

    @staticmethod
    def _draft_probs(proposals: list[_Proposal | None], ks: list[int],
                     device: torch.device) -> SparseProbs | None:
        """None when every draft is one-hot; else sparse rows, one-hot ones as K=1, prob 1."""
        if not any(p is not None and p.distributions for p in proposals):
            return None
        rows = []
        for prop in proposals:
            if prop is None:
                continue
            if prop.distributions:
                rows.extend(prop.distributions)
            else:
                rows.extend((torch.tensor([t]), torch.ones(1)) for t in prop.tokens)
        width = max(idx.numel() for idx, _ in rows)
        indices = torch.zeros(len(rows), width, dtype=torch.long)
        probs = torch.zeros(len(rows), width, dtype=torch.float32)
        for i, (idx, p) in enumerate(rows):
            indices[i, :idx.numel()] = idx
            probs[i, :p.numel()] = p
        return SparseProbs(indices.to(device), probs.to(device))

    # -- results -------------------------------------------------------------------------------

    def _apply(self, seq: Sequence, prop: _Proposal | None, new_tokens: list[int],
               n_accepted: int) -> None:
        if seq.finished:
            return
        k = len(prop.tokens) if prop else 0
        # Cached now: every old token plus all k drafts; keep the old ones + accepted drafts.
        seq.num_computed = len(seq.tokens) + n_accepted
        self.runner.kv.truncate(seq.blocks, seq.num_computed)
        seq.steps += 1
        seq.proposed += k
        seq.accepted += n_accepted
        if k:
            m = self.stats.per_method.setdefault(seq.inp.speculation.method, MethodStats())
            m.proposed_tokens += k
            m.accepted_tokens += n_accepted
        appended = seq.tracker.append(new_tokens)
        seq.tokens.extend(appended.token_ids)
        self.stats.generated_tokens += len(appended.token_ids)
        if appended.finish_reason is not None:
            self._finish(seq, appended.finish_reason, appended.token_ids, appended.text)
        elif seq.aborted:
            self._finish(seq, "abort", appended.token_ids, appended.text)
        elif appended.token_ids or appended.text:
            seq.outputs.put_nowait(StepOutput(appended.token_ids, appended.text))

    def _release(self, seq: Sequence) -> None:
        seq.finished = True
        self._by_id.pop(seq.request_id, None)
        self.scheduler.remove(seq)
        method = seq.inp.speculation.method
        if method in self.proposers and seq.proposer_epoch == self.proposers[method].epoch:
            self.proposers[method].release([seq.request_id])

    def _finish(self, seq: Sequence, reason: str, token_ids: list[int] | None = None,
                text: str = "") -> None:
        self._release(seq)
        if reason == "abort":
            self.stats.aborted_requests += 1
        else:
            self.stats.finished_requests += 1
        seq.outputs.put_nowait(StepOutput(token_ids or [], text, reason, seq.usage()))

    def _fail(self, seq: Sequence, exc: BaseException) -> None:
        self._release(seq)
        seq.outputs.put_nowait(exc)
