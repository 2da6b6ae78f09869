"""EAGLE as an in-target method (registry name `eagle`): a head on the target's own features
drafts inside the verifier, with no proposer process and no wire.

Served when the verifier is given a head (`--eagle DIR`: an EAGLE-1/2 or EAGLE-3 checkpoint as
published, verifier_service/eagle_format.py; `splitspec up` passes the one it finds next to the
target). At start-up the head is bound to the target (`bind`): its token embedding and, for
heads without their own, its output head (whole: under tensor parallelism rank 0, where the
head drafts, kept copies of them before cutting its vocabulary shards); and the runner is told
which features every step must compute for every fed row (EAGLE-3: the residual-stream inputs
of three layers; EAGLE-1/2: the final-norm hidden state: ModelRunner.feature_layers). Per
sequence (`EagleState`):

    prefill chunk cached      prefilled(features, p): the head's rows p .. p + n - 1 from the
                              target's features there and the tokens after them (the prompt)
    a step verified           observe(outcome): the kept rows' features (the step's uncached
                              tokens, then the accepted path) with the tokens after them (the
                              last one: the step's recovered or bonus token) replace whatever
                              the head had guessed there; the last row is the next draft's root
    a step wants k tokens     propose: from the root, a chain (greedy: argmax fed back; sampled:
                              drawn from the head's own distribution after the request's sampling
                              parameters, sent with that q) or, for a plan allowing num_branches
                              > 1, an EAGLE-2 dynamic tree: the top-num_branches frontier grown
                              by cumulative log-probability, the k best nodes kept (deterministic
                              nodes: one-hot to the tree sampler)
    finished, preempted       free (a re-admitted sequence starts afresh from its prefill)

The head's own layer runs on the target's device (verifier_service/eagle_head.py: its drafting
loops read nothing back until the draft is handed over, once). Where the device captures graphs,
a chain (greedy or sampled) replays one captured iteration per drafted token, a tree of 2, 3 or
4 children per node one captured graph per depth, and the advance over a step's kept rows one
captured width (verifier_service/eagle_graphs.py); other trees and wide prefill chunks run
eagerly. The stats count chains, trees and advances run each way.
"""

from __future__ import annotations

import logging
from typing import Sequence as Seq

import torch

from splitspec.device import supports_graphs, to_device
from splitspec.params import SamplingParams, SpeculationPlan
from splitspec.proposal import Draft
from verifier_service import eagle_format
from verifier_service.eagle_graphs import EagleGraphs
from verifier_service.eagle_head import EagleHead, EagleSequence
from verifier_service.in_target import InTargetMethod, InTargetState, PendingDraft, StepOutcome

log = logging.getLogger(__name__)

TREE_BRANCHES = (2, 3, 4)  # children per node of the trees captured as graphs (others: eager)
MAX_TREE_DEPTH = 6  # levels an EAGLE-2 tree grows at most (its nodes: the plan's k)
DRAFT_TOP_K = 16  # a sampled chain's q keeps the head's this many likeliest tokens


class EagleMethod(InTargetMethod):
    def __init__(self, path: str, linear: str = "auto", max_k: int = 16, graphs: bool = True):
        self.path = path
        self.linear = linear  # the head's matmul kernels (kernels/linear.py), as the target's
        self.max_k = max_k  # the longest chain a request may ask for
        self.capture = graphs  # --graphs: capture where the device can
        self.head: EagleHead | None = None
        self.graphs: EagleGraphs | None = None  # chains and advances as device graphs
        self.counters = {"drafted_tokens_total": 0.0, "root_missing_total": 0.0,
                         "graph_chains_total": 0.0, "eager_chains_total": 0.0,
                         "graph_trees_total": 0.0, "eager_trees_total": 0.0,
                         "graph_advances_total": 0.0, "eager_advances_total": 0.0}
        self.sequences = 0

    @classmethod
    def from_verifier(cls, vocab_size: int, config=None) -> "EagleMethod | None":
        path = getattr(config, "eagle", "") if config is not None else ""
        if not path:
            return None
        return cls(path, getattr(config, "linear", "auto"),
                   getattr(config, "max_num_speculative_tokens", 16),
                   getattr(config, "graphs", "auto") != "off")

    def bind(self, runner) -> None:
        """Load the head onto the target (ValueError with one line when it does not fit)."""
        spec, weights = eagle_format.load(self.path)
        why = eagle_format.misfit(spec, runner.config.to_dict())
        if why is None and not runner.lean:
            why = "the target runs the transformers forward, which computes no features"
        embed, head = runner.take_vocab_tables() if why is None else (None, None)
        tables = dict(embed=embed, head=head)
        missing = [n for n in eagle_format.target_tables(spec, weights) if tables[n] is None]
        if why is None and missing:
            why = (f"this rank holds no whole {' or '.join(missing)} of the target (its "
                   "tensor-parallel shards were cut without them)")
        if why is not None:
            raise ValueError(f"--eagle {self.path}: {why}")
        if embed is None:  # the head has its own; this rank's shard only sets device and dtype
            embed = runner._lean.embed
        self.head = EagleHead(spec, weights, embed, head, linear=self.linear)
        runner.feature_layers = spec.feature_layers(runner.config.num_hidden_layers)
        if self.capture and supports_graphs(runner.device):
            depths = range(1, min(self.max_k, MAX_TREE_DEPTH) + 1)
            self.graphs = EagleGraphs(self.head, runner.max_model_len, self.max_k,
                                      top_k=DRAFT_TOP_K,
                                      tree_shapes=[(b, d) for b in TREE_BRANCHES for d in depths])
            self.graphs.capture()
        log.info("EAGLE-%d head %s on the target's %s", spec.version, self.path,
                 f"layers {list(runner.feature_layers)} inputs" if runner.feature_layers
                 else "final hidden state")

    def admit(self, request_id: str, tokens: Seq[int], sampling: SamplingParams,
              plan: SpeculationPlan) -> "EagleState":
        self.sequences += 1
        return EagleState(self, request_id, tokens, sampling, plan)

    def stats(self) -> dict[str, float]:
        pool = float(self.graphs.pool_bytes) if self.graphs is not None else 0.0
        return {**self.counters, "sequences": float(self.sequences), "graph_pool_bytes": pool}


class EagleState(InTargetState):
    features = True

    def __init__(self, method: EagleMethod, request_id: str, tokens: Seq[int],
                 sampling: SamplingParams, plan: SpeculationPlan):
        self.method = method
        self.request_id = request_id
        self.tokens = list(tokens)  # the sequence's history as the state knows it
        self.sampling = sampling
        self.branches = plan.num_branches
        self.seq: EagleSequence | None = method.head.new_sequence(len(tokens) + 256)

    def _advance(self, features: torch.Tensor, position: int, next_tokens: list[int]) -> None:
        if self.seq is None or not len(next_tokens):
            return
        if position != self.seq.length:  # rows the head never saw, or seen twice: start over
            self.seq.truncate(min(position, self.seq.length))
            if position != self.seq.length:
                return
        # the tokens to the device without the host waiting for its queue
        tokens = to_device(torch.tensor(next_tokens), features.device)
        graphs, rows = self.method.graphs, features.shape[0]
        if graphs is not None and graphs.captured_advance(rows) and \
                graphs.serves_advance(self.seq, rows):
            self.method.counters["graph_advances_total"] += 1
            graphs.advance(self.seq, features, tokens)
        else:
            self.method.counters["eager_advances_total"] += 1
            self.seq.advance(features, tokens)

    def prefilled(self, features, position: int) -> None:
        n = features.shape[0]
        self._advance(features, position, self.tokens[position + 1:position + 1 + n])

    def observe(self, outcome: StepOutcome) -> None:
        features, p = outcome.features, outcome.position
        if features is not None:
            accepted = outcome.emitted[:outcome.num_accepted]
            # row j's next token: the fed rows' tokens one on, then the step's extra token
            rows = self.tokens[p:] + accepted
            nxt = (rows[1:] + outcome.emitted[outcome.num_accepted:][:1])[:features.shape[0]]
            self._advance(features, p, nxt)
        self.tokens.extend(outcome.emitted)

    def propose(self, tokens: Seq[int], k: int) -> "list[int] | Draft | PendingDraft":
        if self.seq is None or k <= 0:
            return []
        if self.seq.root_out is None:
            self.method.counters["root_missing_total"] += 1
            return []
        self.method.counters["drafted_tokens_total"] += k
        if self.branches > 1:
            depth, graphs = min(k, MAX_TREE_DEPTH), self.method.graphs
            replayed = (graphs is not None and graphs.captured_tree(self.branches, depth)
                        and graphs.serves_tree(self.seq, self.branches, depth))
            self.method.counters["graph_trees_total" if replayed else "eager_trees_total"] += 1
            if replayed:  # read back with the step's other sequences' drafts
                return self._named(graphs.pending_tree(self.seq, self.branches, depth, k))
            draft = self.seq.draft_tree(self.branches, depth, k)
        else:
            greedy, graphs = self.sampling.greedy, self.method.graphs
            replayed = (graphs is not None and graphs.serves(self.seq, k)
                        and (graphs.captured if greedy else graphs.captured_sampled))
            self.method.counters["graph_chains_total" if replayed else "eager_chains_total"] += 1
            if greedy:
                return graphs.pending_chain(self.seq, k) if replayed else self.seq.chain(k).tolist()
            if replayed:
                return self._named(graphs.pending_sampled_chain(self.seq, k, self.sampling,
                                                                len(tokens)))
            draft = self.seq.sampled_chain(k, self.sampling, len(tokens), DRAFT_TOP_K)
        draft.seq_id = self.request_id
        return draft

    def _named(self, pending: PendingDraft) -> PendingDraft:
        """The pending Draft, finished under this sequence's id."""
        def finish(ints, floats) -> Draft:
            draft = pending.finish(ints, floats)
            draft.seq_id = self.request_id
            return draft

        return PendingDraft(pending.ints, pending.floats, finish)

    def free(self) -> None:
        if self.seq is not None:
            self.seq.free()
            self.seq = None
            self.method.sequences -= 1
