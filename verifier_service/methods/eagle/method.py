"""EAGLE as an in-target method (registry name `eagle`): a head on the target's own features
drafts inside the verifier, with no proposer process and no wire.

Served when the verifier is given a head (`--eagle DIR`: an EAGLE-1/2 or EAGLE-3 checkpoint as
published, verifier_service/methods/eagle/checkpoint.py; `splitspec up` passes the one it finds
next to the target). At start-up the head is bound to the target (`bind`): its token embedding and,
for heads without their own, its output head (whole: under tensor parallelism rank 0, where the
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

A step's sequences are batched: what `prefilled` and `observe` hand over is kept (`pending`)
and advanced at the method's next `flush` (the start of the next step's drafting, before its
forward) for every sequence at once, and the step's chains are drafted together
(`propose_many`). Where the head runs eagerly (a CPU, or --graphs off) that is one pass of the
head's layer per drafted level over every sequence (head.advance_many, chain_many, and
for sampled requests sampled_chain_many: each row its own parameters, q and keyed noise), so a
batch of B reads the head's weights once per level instead of B times; where the device
captures graphs, one replay per level for the step's greedy chains, one per level for its
sampled chains, and one for the advance over every sequence
(verifier_service/methods/eagle/batch_graphs.py).

The head's own layer runs on the target's device (verifier_service/methods/eagle/head.py: its
drafting loops read nothing back). Every draft, greedy or sampled chain (with its q) or tree
(with its parents and bounds: its levels and children per node), is handed to the step still
on the device (`device_chain`, `device_sampled_chain`, `device_tree`: a PendingDraft naming its
parts), which feeds it to its forward and samplers from there and reads it back with its
results (verifier_service/step/device_drafts.py): one wait per step. Where the device captures
graphs, a lone sequence's chain (greedy or sampled) replays one captured iteration per drafted
token, a tree of 2, 3 or 4 children per node one captured graph per depth, and a lone advance over a
step's kept rows one captured width (verifier_service/methods/eagle/graphs.py); other trees and wide
prefill chunks run eagerly. The stats count chains, trees and advances run each way, and the
batched passes (`chain_batches_total`, `advance_batches_total`).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Sequence as Seq

import torch

from splitspec.device import supports_graphs, to_device
from splitspec.params import SamplingParams, SpeculationPlan
from splitspec.proposal import Draft
from splitspec.vocab_frequencies import parse_setting, resolve_subset
from verifier_service.methods.eagle import checkpoint as eagle_format
from verifier_service.methods.eagle import dummy as eagle_dummy
from verifier_service.methods.eagle.graphs import EagleGraphs
from verifier_service.methods.eagle.head import (
    EagleHead,
    EagleSequence,
    advance_many,
    chain_many,
    sampled_chain_rows,
    sampled_draft,
)
from verifier_service.methods.eagle.row_cache import HeadRowCache
from verifier_service.methods.in_target import (
    InTargetMethod,
    InTargetState,
    PendingDraft,
    StepOutcome,
)

log = logging.getLogger(__name__)

TREE_BRANCHES = (2, 3, 4)  # children per node of the trees captured as graphs (others: eager)
# sequences whose greedy chains replay one captured iteration together at most (more draft in
# groups of it); their static cache is this many times a sequence's capacity
MAX_CHAIN_BATCH = 16
MAX_TREE_DEPTH = 6  # levels an EAGLE-2 tree grows at most (its nodes: the plan's k)
DRAFT_TOP_K = 16  # a sampled chain's q keeps the head's this many likeliest tokens


def device_chain(ids: torch.Tensor) -> PendingDraft:
    """A greedy chain [k] left on the device: fed to the step from there."""
    return PendingDraft([ids], [], lambda got, _: got[0].tolist(), ids=ids)


def device_tree(ids: torch.Tensor, parents: torch.Tensor, depth: int, top_k: int
                ) -> PendingDraft:
    """An EAGLE-2 tree left on the device (head.py `tree`), with its bounds: `depth` levels,
    at most top_k children per node."""
    return PendingDraft([ids, parents], [],
                        lambda got, _: Draft("", got[0].tolist(), parents=got[1].tolist()),
                        ids=ids, parents=parents, max_depth=depth, max_children=top_k)


def device_sampled_chain(ids: torch.Tensor, q_ids: torch.Tensor, q_probs: torch.Tensor
                         ) -> PendingDraft:
    """A sampled chain [k] and its truncated q [k, K] left on the device."""
    return PendingDraft([ids, q_ids], [q_probs],
                        lambda got, f: sampled_draft(got[0], got[1], f[0]), ids=ids,
                        q_ids=q_ids, q_probs=q_probs)


class EagleMethod(InTargetMethod):
    def __init__(self, path: str, linear: str = "auto", max_k: int = 16, graphs: bool = True,
                 max_num_seqs: int = 1, vocab_subset: str = "auto", load_format: str = "auto",
                 load_seed: int = 0):
        self.path = path
        self.load_format, self.load_seed = load_format, load_seed  # dummy: eagle/dummy.py
        # which rows of the target's output head an EAGLE-1/2 head scores with
        # (splitspec/vocab_frequencies.py: the head directory's token_frequencies.json)
        self.vocab_subset = vocab_subset
        self.linear = linear  # the head's matmul kernels (kernels/linear.py), as the target's
        self.max_k = max_k  # the longest chain a request may ask for
        self.capture = graphs  # --graphs: capture where the device can
        self.max_num_seqs = max_num_seqs  # the running batch at most
        self.head: EagleHead | None = None
        self.graphs: EagleGraphs | None = None  # chains and advances as device graphs
        self.counters = {"drafted_tokens_total": 0.0, "root_missing_total": 0.0,
                         "graph_chains_total": 0.0, "eager_chains_total": 0.0,
                         "graph_trees_total": 0.0, "eager_trees_total": 0.0,
                         "graph_advances_total": 0.0, "eager_advances_total": 0.0,
                         "chain_batches_total": 0.0, "advance_batches_total": 0.0}
        self.sequences = 0
        # prefix caching: the head's rows of cached target blocks (None: caching off)
        self.prefix_caching = True
        self.rows: HeadRowCache | None = None
        # states whose target rows wait for the next flush, in arrival order
        self.deferred: dict[EagleState, None] = {}

    @classmethod
    def from_verifier(cls, vocab_size: int, config=None) -> "EagleMethod | None":
        path = getattr(config, "eagle", "") if config is not None else ""
        if not path:
            return None
        method = cls(path, getattr(config, "linear", "auto"),
                     getattr(config, "max_num_speculative_tokens", 16),
                     getattr(config, "graphs", "auto") != "off",
                     getattr(config, "max_num_seqs", 1),
                     getattr(config, "eagle_vocab_subset", "auto"),
                     getattr(config, "load_format", "auto"), getattr(config, "load_seed", 0))
        method.prefix_caching = getattr(config, "enable_prefix_caching", True)
        return method

    def bind(self, runner) -> None:
        """Load the head onto the target (ValueError with one line when it does not fit)."""
        spec, weights = eagle_dummy.load(self.path, self.load_format, self.load_seed)
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
        self.head = EagleHead(spec, weights, embed, head, self._vocab_ids(spec, weights),
                              linear=self.linear)
        runner.feature_layers = spec.feature_layers(runner.config.num_hidden_layers)
        if self.prefix_caching:  # as many blocks of the head's rows as the target has blocks
            self.rows = HeadRowCache(runner.kv.block_size, runner.kv.num_blocks)
        if self.capture and supports_graphs(runner.device):
            depths = range(1, min(self.max_k, MAX_TREE_DEPTH) + 1)
            self.graphs = EagleGraphs(self.head, runner.max_model_len, self.max_k,
                                      top_k=DRAFT_TOP_K,
                                      tree_shapes=[(b, d) for b in TREE_BRANCHES for d in depths],
                                      max_batch=min(self.max_num_seqs, MAX_CHAIN_BATCH))
            self.graphs.capture()
        log.info("EAGLE-%d head %s on the target's %s", spec.version, self.path,
                 f"layers {list(runner.feature_layers)} inputs" if runner.feature_layers
                 else "final hidden state")

    def _vocab_ids(self, spec, weights) -> torch.Tensor | None:
        """The target ids a head scoring with the target's output head scores (None: all of
        them); a head with its own lm_head has its own draft vocabulary."""
        flag = "--eagle-vocab-subset"
        if "head" not in eagle_format.target_tables(spec, weights):
            if parse_setting(self.vocab_subset, flag):
                raise ValueError(f"{flag} {self.vocab_subset}: the head at {self.path} scores "
                                 f"with its own lm_head over {spec.draft_vocab_size} tokens")
            return None
        return resolve_subset(self.path, self.vocab_subset, spec.vocab_size, flag)

    def reuse_limit(self, keys: Seq[bytes]) -> int:
        """The target blocks whose head rows are kept (row_cache.py): a prompt's last cached
        block, at least, is computed again for its features."""
        return self.rows.reusable(keys) if self.rows is not None else 0

    def admit(self, request_id: str, tokens: Seq[int], sampling: SamplingParams,
              plan: SpeculationPlan) -> "EagleState":
        self.sequences += 1
        return EagleState(self, request_id, tokens, sampling, plan)

    def flush(self, states: "Seq[EagleState] | None" = None) -> int:
        """Advance every deferred state (or those of `states`) by the rows it was handed: on
        the CPU in one pass of the head's layer, on a device in one replay of the batched
        advance (a lone sequence, or rows it does not fit, as before); returns how many states
        were advanced."""
        todo = [st for st in (self.deferred if states is None else states) if st.pending]
        for st in todo:
            self.deferred.pop(st, None)
        if not todo:
            return 0
        feats, ids = [], []
        for st in todo:
            parts = [f for f, _ in st.pending]
            feats.append(parts[0] if len(parts) == 1 else torch.cat(parts))
            ids.append([t for _, ts in st.pending for t in ts])
            st.pending, st.pending_rows = [], 0
        batch = self.graphs.batch if self.graphs is not None else None
        if batch is None:
            self.counters["eager_advances_total"] += len(todo)
            self.counters["advance_batches_total"] += 1
            advance_many([st.seq for st in todo], feats,
                         [to_device(torch.tensor(t), f.device) for f, t in zip(feats, ids)])
            return len(todo)
        together = [i for i, st in enumerate(todo) if batch.serves_advance(st.seq, len(ids[i]))]
        if len(together) >= 2:
            self.counters["graph_advances_total"] += len(together)
            self.counters["advance_batches_total"] += 1
            batch.advance([todo[i].seq for i in together], [feats[i] for i in together],
                          [ids[i] for i in together])
        else:
            together = []
        for i, st in enumerate(todo):
            if i not in together:
                st.advance_now(feats[i], ids[i])
        return len(todo)

    def propose_many(self, items):
        """EagleState.propose for a step's sequences: deferred rows advanced first, then the
        greedy chains drafted together and the sampled ones together (replayed where the
        batched chain is captured, else eagerly); the rest each on its own."""
        self.flush()
        out: list = [None] * len(items)
        together, replayed, sampled, replayed_sampled = [], [], [], []
        for i, (state, _, k) in enumerate(items):
            if state.chains_in_batch_graph(k):
                replayed.append(i)
            elif state.chains_eagerly(k):
                together.append(i)
            elif state.samples_in_batch_graph(k):
                replayed_sampled.append(i)
            elif state.samples_eagerly(k):
                sampled.append(i)
        # a lone chain replays its own graph, or drafts alone
        replayed, sampled, replayed_sampled = (
            group if len(group) > 1 else [] for group in (replayed, sampled, replayed_sampled))
        batched = set(together) | set(replayed) | set(sampled) | set(replayed_sampled)
        for i, (state, tokens, k) in enumerate(items):
            if i not in batched:
                out[i] = state.propose(tokens, k)
        if replayed:
            ks = self._counted(items, replayed, replayed=True)
            rows = self.graphs.batch.chains([items[i][0].seq for i in replayed], ks)
            for i, row in zip(replayed, rows):  # fed to the step from the device
                out[i] = device_chain(row)
        if together:
            seqs = [items[i][0].seq for i in together]
            ks = self._counted(items, together, replayed=False)
            rows = chain_many(seqs, ks)  # left on the device, fed to the step from there
            for r, (i, k) in enumerate(zip(together, ks)):
                out[i] = device_chain(rows[r, :k])
        if replayed_sampled:
            states = [items[i][0] for i in replayed_sampled]
            ks = self._counted(items, replayed_sampled, replayed=True)
            rows = self.graphs.batch.sampled_chains(
                [st.seq for st in states], ks, [st.sampling for st in states],
                [len(items[i][1]) for i in replayed_sampled])
            for i, st, (tokens, ids, probs) in zip(replayed_sampled, states, rows):
                out[i] = st._named(device_sampled_chain(tokens, ids, probs))
        if sampled:
            states = [items[i][0] for i in sampled]
            ks = self._counted(items, sampled, replayed=False)
            tokens, ids, probs = sampled_chain_rows([st.seq for st in states], ks,
                                                    [st.sampling for st in states],
                                                    [len(items[i][1]) for i in sampled],
                                                    DRAFT_TOP_K)
            for r, (i, st, k) in enumerate(zip(sampled, states, ks)):
                out[i] = st._named(device_sampled_chain(tokens[r, :k], ids[r, :k],
                                                        probs[r, :k]))
        return out

    def _counted(self, items, group: list[int], replayed: bool) -> list[int]:
        """The ks of a group of chains drafted together (replayed as graphs or eagerly),
        counted as one batched pass."""
        ks = [items[i][2] for i in group]
        self.counters["drafted_tokens_total"] += sum(ks)
        self.counters["graph_chains_total" if replayed else "eager_chains_total"] += len(ks)
        self.counters["chain_batches_total"] += 1
        return ks

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
        # target rows handed over but not yet advanced (features [n, F], next tokens), and
        # their count: the head runs eagerly, and advances them with other sequences' at flush
        self.pending: list[tuple[torch.Tensor, list[int]]] = []
        self.pending_rows = 0
        self.offered = 0  # leading blocks whose rows the method's row cache has

    def restore(self, keys: Seq[bytes], num_tokens: int) -> None:
        rows = self.method.rows
        if rows is None or self.seq is None:
            return
        n = num_tokens // rows.block_size
        self.seq._reserve(num_tokens)
        if rows.restore(keys, n, self.seq.keys, self.seq.values):
            self.seq.length, self.offered = n * rows.block_size, n
        # else the head starts empty: rows from num_tokens on do not follow, so it drafts
        # nothing for this sequence (lossless; speculation lost)

    def offer(self, keys: Seq[bytes]) -> None:
        rows, seq = self.method.rows, self.seq
        if rows is None or seq is None:
            return
        bs = rows.block_size
        while self.offered + 1 < len(keys) and (self.offered + 1) * bs <= seq.length:
            b = self.offered
            rows.put(keys[b + 1], seq.keys[:, :, b * bs:(b + 1) * bs],
                     seq.values[:, :, b * bs:(b + 1) * bs])
            self.offered += 1

    def _align(self, position: int) -> bool:
        """Whether rows from `position` follow what the head holds; rows it never saw, or saw
        twice, start it over from there."""
        if position != self.seq.length:
            self.seq.truncate(min(position, self.seq.length))
        return position == self.seq.length

    def _advance(self, features: torch.Tensor, position: int, next_tokens: list[int]) -> bool:
        """The target's rows from `position`; True when they wait for the method's flush
        (batched with the step's other sequences: eagerly, or where the batched advance is
        captured)."""
        if self.seq is None or not len(next_tokens):
            return False
        graphs = self.method.graphs
        if graphs is None or (graphs.batch is not None and graphs.batch.captured_advance):
            if position != self.seq.length + self.pending_rows:
                self.method.flush([self])
                if not self._align(position):
                    return False
            self.pending.append((features, list(next_tokens)))
            self.pending_rows += len(next_tokens)
            self.method.deferred[self] = None
            return True
        if self._align(position):
            self.advance_now(features, next_tokens)
        return False

    def advance_now(self, features: torch.Tensor, next_tokens: list[int]) -> None:
        """The rows after what the head holds, this sequence alone: its advance graph where
        one serves them, else eagerly."""
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

    def observe(self, outcome: StepOutcome) -> bool:
        features, p = outcome.features, outcome.position
        deferred = False
        if features is not None:
            accepted = outcome.emitted[:outcome.num_accepted]
            # row j's next token: the fed rows' tokens one on, then the step's extra token
            rows = self.tokens[p:] + accepted
            nxt = (rows[1:] + outcome.emitted[outcome.num_accepted:][:1])[:features.shape[0]]
            deferred = self._advance(features, p, nxt)
        self.tokens.extend(outcome.emitted)
        return deferred

    def chains_eagerly(self, k: int) -> bool:
        """Whether a chain of k for this sequence is a greedy one the graphs do not serve (the
        ones `EagleMethod.propose_many` drafts together)."""
        seq, graphs = self.seq, self.method.graphs
        return (seq is not None and k > 0 and seq.root_out is not None and self.branches <= 1
                and self.sampling.greedy and not self.pending
                and not (graphs is not None and graphs.captured and graphs.serves(seq, k)))

    def samples_eagerly(self, k: int) -> bool:
        """Whether a chain of k for this sequence is a sampled one its graphs do not serve (the
        ones `EagleMethod.propose_many` draws together)."""
        seq, graphs = self.seq, self.method.graphs
        return (seq is not None and k > 0 and seq.root_out is not None and self.branches <= 1
                and not self.sampling.greedy and not self.pending
                and not (graphs is not None and graphs.captured_sampled
                         and graphs.serves(seq, k)))

    def samples_in_batch_graph(self, k: int) -> bool:
        """Whether a chain of k for this sequence is a sampled one the batched sampled chain
        graph serves (`EagleMethod.propose_many` replays those of a step together)."""
        seq, graphs = self.seq, self.method.graphs
        batch = graphs.batch if graphs is not None else None
        return (seq is not None and k > 0 and self.branches <= 1 and not self.sampling.greedy
                and batch is not None and batch.captured_sampled and batch.serves(seq, k))

    def chains_in_batch_graph(self, k: int) -> bool:
        """Whether a chain of k for this sequence is a greedy one the batched chain graph
        serves (`EagleMethod.propose_many` replays those of a step together)."""
        seq, graphs = self.seq, self.method.graphs
        batch = graphs.batch if graphs is not None else None
        return (seq is not None and k > 0 and self.branches <= 1 and self.sampling.greedy
                and batch is not None and batch.captured and batch.serves(seq, k))

    def propose(self, tokens: Seq[int], k: int) -> "list[int] | Draft | PendingDraft":
        if self.pending:
            self.method.flush()
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
            if replayed:  # fed to the step from the device
                return self._named(graphs.pending_tree(self.seq, self.branches, depth, k))
            tokens, parents, _ = self.seq.tree(self.branches, depth, k)
            return self._named(device_tree(tokens, parents, depth, self.branches))
        else:
            greedy, graphs = self.sampling.greedy, self.method.graphs
            replayed = (graphs is not None and graphs.serves(self.seq, k)
                        and (graphs.captured if greedy else graphs.captured_sampled))
            self.method.counters["graph_chains_total" if replayed else "eager_chains_total"] += 1
            if greedy:
                return (graphs.pending_chain(self.seq, k) if replayed
                        else device_chain(self.seq.chain(k)))
            if replayed:
                return self._named(graphs.pending_sampled_chain(self.seq, k, self.sampling,
                                                                len(tokens)))
            rows = sampled_chain_rows([self.seq], [k], [self.sampling], [len(tokens)],
                                      DRAFT_TOP_K)
            return self._named(device_sampled_chain(*(t[0, :k] for t in rows)))

    def _named(self, pending: PendingDraft) -> PendingDraft:
        """The pending Draft, finished under this sequence's id."""
        def finish(ints, floats) -> Draft:
            draft = pending.finish(ints, floats)
            draft.seq_id = self.request_id
            return draft

        return dataclasses.replace(pending, finish=finish)

    def free(self) -> None:
        self.method.deferred.pop(self, None)
        self.pending, self.pending_rows = [], 0
        if self.seq is not None:
            self.seq.free()
            self.seq = None
            self.method.sequences -= 1
