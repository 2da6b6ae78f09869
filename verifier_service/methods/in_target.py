"""Methods whose candidates are produced inside the verifier (registry kind `in_target`).

Some methods need no proposer process: their candidates come from the target's own steps
(lookahead decoding's Jacobi window and n-gram pool; later, heads on the target's hidden state).
Such a method is a class implementing `InTargetMethod`, named in splitspec/methods.py with
`kind=Kind.IN_TARGET`; the verifier makes one per method it serves (`InTargetDrafts.from_registry`).
Each sequence whose plan names the method gets its own `InTargetState`:

    the verifier starts             method = from_verifier(vocab_size, config) (None: not served
                                                                 here, e.g. no head configured);
                                    method.bind(runner)       (the target: its weights, and the
                                                                 features it should hand over)
    a request arrives               method.check_plan(plan, max_k)  (InvalidArgument if the
                                                                 method cannot run its plan here)
    admitted to the running batch   method.admit(...)        -> state  (a method that
                                                                 `reads_grammar` is also handed
                                                                 the sequence's grammar state:
                                                                 grammar=, None if unstructured)
    a prefill chunk was cached      state.prefilled(features, position)  (states that read the
                                                                 target's features: its rows')
    a step wants k draft tokens     state.propose(tokens, k)  -> up to k candidate token ids,
                                                                 or a Draft tree of <= k nodes,
                                                                 or either left on the device
                                                                 (PendingDraft: fed to the step
                                                                 from there, a DeviceDraft, when
                                                                 it names its parts; else read
                                                                 back in one copy for the step)
    the step was verified           state.observe(outcome)    (with the target's argmax after
                                                                 every node: what the method
                                                                 learns from its own rows; True:
                                                                 kept for the method's flush)
    a step starts drafting          method.flush()            (what states kept, learnt for
                                                                 all of them at once)
                                    method.propose_many(...)  (the step's states of the method
                                                                 together; by default each
                                                                 state's propose)
    finished, aborted, failed or    state.free()              (a preempted sequence gets a
    preempted                                                  fresh state when re-admitted)

Candidates are deterministic (one-hot q), as lookahead's are, and are checked like a proposer's
before the verifier uses them: a state that returns garbage costs only that step's speculation.
A tree may branch as the method likes within its node budget (the request's num_branches bounds
what proposers send; an in-target method owns its own shape).
The engine reaches this through verifier_service/drafts/collector.py, beside the proposer clients,
and never names a method.
"""

from __future__ import annotations

import abc
import dataclasses
import importlib
import time
from dataclasses import dataclass, field
from typing import Callable
from typing import Sequence as Seq

import torch

from kernels.sparse_probs import SparseProbs
from splitspec import device as dev
from splitspec.methods import components_of, in_target_methods
from splitspec.params import SamplingParams, SpeculationPlan
from splitspec.proposal import Draft
from verifier_service.batching.scheduler import Scheduled
from verifier_service.batching.sequence import SequenceState


@dataclass(frozen=True)
class StepOutcome:
    """What one verified step did to a sequence, as its state is told."""

    draft: list[int]  # the candidates verified this step (empty: none)
    num_accepted: int  # how many of them were accepted (the depth of the accepted path)
    emitted: list[int]  # the tokens the step emitted: accepted candidates + recovered/bonus
    parents: list[int] = field(default_factory=list)  # the draft's tree (a chain: i - 1)
    path: list[int] = field(default_factory=list)  # accepted nodes, root first
    node_argmax: list[int] = field(default_factory=list)  # target's argmax after each node
    history: Seq[int] = ()  # the sequence's tokens after the step
    # states that read the target's features: the kept rows' features [n, F] on the target's
    # device (the step's uncached tokens, then the accepted path), the first at `position`
    features: object = None
    position: int = 0


@dataclass(frozen=True)
class PendingDraft:
    """Candidates a state left on the device: `ints` and `floats` (device tensors) to bring to
    the host, and `finish`, which makes the candidates (ids or a Draft) from their host copies
    (numpy arrays, in the same order). A step's pending candidates, over every sequence, come
    over together: one copy and one wait for the batch, not one per sequence.

    Where the draft's parts are named as device tensors too (`ids`, and for a tree `parents`
    with its bounds, for a sampled chain its q), the step feeds them to its forward and its
    sampler from the device (a DeviceDraft) and reads them back with its results: no wait of
    their own. Those parts are valid by construction (see DeviceDraft)."""

    ints: list
    floats: list
    finish: Callable[[list, list], "list[int] | Draft"]
    ids: object = None  # int64 [k] on the device: the draft's target ids
    parents: object = None  # int64 [k]: a tree's parents (local, -1: the root); None: a chain
    max_depth: int = 0  # a tree's host bounds: levels, and children per node
    max_children: int = 0
    q_ids: object = None  # a sampled chain's q: int64 [k, K] target ids, float [k, K] probs
    q_probs: object = None


@dataclass
class DeviceDraft(Draft):
    """A draft whose parts are still on the target's device (an in-target method drew them
    there): `tokens` holds k placeholders (a tree's `parents` a placeholder of the same node
    count, every node on the root) until the step that verifies it reads them back with its
    results. The step copies the ids into its input on the device, builds a tree's positions
    and ancestor mask there (kernels/tree_layout.py), and hands ids, parents and q to its
    samplers as device tensors (verifier_service/step/verify.py); a tensor-parallel step, and
    a hybrid's merge, read them first (`materialize`).

    Valid by construction, so the collector's host checks are not needed: the ids are argmax or
    top-k picks over the target's own vocabulary (the step still clamps them to it: a wrong id
    could only cost acceptance); a tree's parents come from kernels/eagle_tree.py `select`, which
    lists each node after its parent, with at most `max_children` children per node and
    `max_depth` levels, within the k nodes asked. Only a q can be malformed (a half-precision
    head can give inf or NaN): the step checks it on the device (finite, non-negative, sums to
    1, the token in its support) and a bad one costs that sequence's speculation only."""

    device_tokens: object = None  # int64 [k] on the device; None once read back
    device_parents: object = None  # int64 [k] a tree's parents on the device, or None
    max_depth: int = 0
    max_children: int = 0
    device_q: object = None  # SparseProbs on the device (a sampled chain's q), or None

    @property
    def on_device(self) -> bool:
        return self.device_tokens is not None

    @property
    def device_tree(self) -> bool:
        return self.device_tokens is not None and self.device_parents is not None

    def fill(self, tokens, parents=None) -> None:
        """Its host copies (from the step's read back): ids, and a tree's parents."""
        self.tokens[:] = [int(t) for t in tokens]
        if parents is not None:
            self.parents[:] = [int(p) for p in parents]
        self.device_tokens = self.device_parents = None


def device_draft(seq_id: str, pending: PendingDraft) -> DeviceDraft:
    """The DeviceDraft of a pending draft that names its parts on the device."""
    k = pending.ids.shape[0]
    tree = pending.parents is not None and k > 1
    q = (SparseProbs(pending.q_ids, pending.q_probs) if pending.q_ids is not None else None)
    return DeviceDraft(seq_id, [0] * k, parents=[-1] * k if tree else None,
                       device_tokens=pending.ids,
                       device_parents=pending.parents if tree else None,
                       max_depth=pending.max_depth, max_children=pending.max_children,
                       device_q=q)


def read_back(drafts: "Seq[DeviceDraft]", fetch) -> None:
    """The drafts' ids, trees' parents and q into their host fields, in one copy (fetch:
    splitspec.device.HostFetch)."""
    ints, floats = [], []
    for d in drafts:
        ints.append(d.device_tokens)
        if d.device_parents is not None:
            ints.append(d.device_parents)
        if d.device_q is not None:
            ints.append(d.device_q.indices)
            floats.append(d.device_q.probs)
    got_i, got_f = fetch(ints, floats)
    at_i = at_f = 0
    for d in drafts:
        tokens, at_i = got_i[at_i], at_i + 1
        parents = None
        if d.device_parents is not None:
            parents, at_i = got_i[at_i], at_i + 1
        if d.device_q is not None:
            d.device_q = SparseProbs(torch.from_numpy(got_i[at_i]),
                                     torch.from_numpy(got_f[at_f]))
            at_i, at_f = at_i + 1, at_f + 1
        d.fill(tokens, parents)


def materialize(d: Draft) -> Draft:
    """A draft with every part on the host (a DeviceDraft read now: its own wait; for the
    merges of hybrids, which compare tokens)."""
    if isinstance(d, DeviceDraft) and d.on_device:
        read_back([d], lambda ints, floats: ([t.cpu().numpy() for t in ints],
                                             [t.float().cpu().numpy() for t in floats]))
    if isinstance(d, DeviceDraft) and d.device_q is not None and d.q is None:
        d.q = d.device_q
    return d


class InTargetState(abc.ABC):
    """One sequence's drafting state inside the verifier; bounded in memory by its method."""

    # whether it reads the target's features (ModelRunner.feature_layers): then each step's
    # outcome carries its kept rows' features and every prefill chunk's rows come to `prefilled`
    features: bool = False

    @abc.abstractmethod
    def propose(self, tokens: Seq[int], k: int) -> "list[int] | Draft | PendingDraft":
        """Up to k candidate tokens to follow `tokens` (the sequence's whole history, the last
        one not yet cached), as a chain of ids or a Draft tree, or either still on the device
        (PendingDraft); [] for none this step."""

    def prefilled(self, features, position: int) -> None:
        """A prefill chunk cached rows from `position` on; their features [n, F] (for states
        with `features`; each row's next token is already in the history)."""

    def observe(self, outcome: StepOutcome) -> bool | None:
        """The step's outcome (called after every step that emitted tokens for the sequence).
        True: the state kept it for its method's next `flush` (which learns from the step's
        sequences together) instead of learning from it now."""

    def free(self) -> None:
        """The sequence left the running batch; drop what the state holds."""

    # prefix caching (verifier_service/batching/prefix_cache.py): a state with rows of its
    # own per position (features) takes back those of the cached blocks the sequence reused,
    # and offers its own for the blocks that became final
    def restore(self, keys: Seq[bytes], num_tokens: int) -> None:
        """The sequence was admitted with its first num_tokens tokens cached (the blocks of
        `keys`, their prefix keys, and more): the state's rows for them, where it keeps any."""

    def offer(self, keys: Seq[bytes]) -> None:
        """The sequence's blocks of `keys` are final: keep the state's rows for them."""


class InTargetMethod(abc.ABC):
    """An in-target method: one instance per verifier, a state per running sequence."""

    # whether `admit` takes the sequence's grammar state as grammar= (a structured request's
    # matcher, verifier_service/grammar/matcher.py; None for a request without a structure)
    reads_grammar: bool = False

    @classmethod
    def from_verifier(cls, vocab_size: int, config=None) -> "InTargetMethod | None":
        """The method as the verifier creates it, knowing the target's vocabulary and the
        verifier's configuration (verifier_service/config.py; None in tests: defaults); None
        when this verifier does not serve it (e.g. a head it was not given)."""
        return cls()

    def bind(self, runner) -> None:
        """The verifier's ModelRunner, once, before any request: a method that drafts from
        the target's weights or features takes them here (runner.feature_layers)."""

    def reuse_limit(self, keys: Seq[bytes]) -> int:
        """Prefix caching: how many of a prompt's leading cached blocks (of these prefix keys)
        a sequence of this method may reuse; a method whose states keep rows of their own per
        position answers how many it can restore (the target computes the rest)."""
        return len(keys)

    def check_plan(self, plan: SpeculationPlan, max_k: int) -> None:
        """Raise InvalidArgument (naming the field) if this verifier cannot run `plan`'s
        method-specific parameters; `max_k` is its node budget limit. Called on arrival."""

    @abc.abstractmethod
    def admit(self, request_id: str, tokens: Seq[int], sampling: SamplingParams,
              plan: SpeculationPlan) -> InTargetState:
        """A state for a sequence joining the running batch with history `tokens`, run as
        `plan` (already checked) says."""

    def propose_many(self, items: "Seq[tuple[InTargetState, Seq[int], int]]") -> list:
        """(state, tokens, k) -> state.propose(tokens, k) for a step's sequences of this method,
        in order; a method that drafts several sequences at once overrides it."""
        return [state.propose(tokens, k) for state, tokens, k in items]

    def flush(self) -> int:
        """Learn what states kept from their observe (True) or prefilled; called at the start of
        every step's drafting, before its forward. Returns how many states learnt."""
        return 0

    def stats(self) -> dict[str, float]:
        """Counters (names ending `_total`) and gauges of the method, for /metrics
        (`splitspec_in_target_<name>{method}`); read at scrape time, from another thread."""
        return {}


def _load(implementation: str) -> type[InTargetMethod]:
    module, _, name = implementation.partition(":")
    return getattr(importlib.import_module(module), name)


class InTargetDrafts:
    """The verifier's in-target methods and their per-sequence states."""

    def __init__(self, methods: dict[str, InTargetMethod]):
        self.methods = methods
        # each sequence's states, by method: one, or a hybrid's (the grammar's forced tokens
        # beside an EAGLE head: each drafts as it would alone)
        self._states: dict[SequenceState, dict[str, InTargetState]] = {}
        # seconds the states spent learning from verified steps (observe), per method, not yet
        # taken into its drafting cost; and the whole of it since the last step's account
        self._observe_s: dict[str, float] = {}
        self.step_observe_s = 0.0
        self._fetch: dict = {}  # per device: the one copy of a step's pending candidates

    @classmethod
    def from_registry(cls, vocab_size: int, config=None, runner=None) -> "InTargetDrafts":
        """Every in-target method of the registry this verifier serves, bound to `runner`."""
        methods = {}
        for name, spec in in_target_methods().items():
            method = _load(spec.implementation).from_verifier(vocab_size, config)
            if method is None:
                continue
            if runner is not None:
                method.bind(runner)
            methods[name] = method
        return cls(methods)

    def serves(self, method: str | None) -> bool:
        return method in self.methods

    def methods_of(self, plan: SpeculationPlan) -> list[str]:
        """The in-target methods a plan drafts with: its method, or a hybrid's in-target ones."""
        return [m for m in components_of(plan.method) if m in self.methods]

    @property
    def num_states(self) -> int:
        return sum(len(states) for states in self._states.values())

    def check_plan(self, plan: SpeculationPlan, max_k: int) -> None:
        for method in self.methods_of(plan):
            self.methods[method].check_plan(dataclasses.replace(plan, method=method), max_k)

    def admit(self, seq: SequenceState) -> None:
        """A sequence joined the running batch: a state for each of these methods its plan names
        (itself or as a hybrid's component, which drafts as the method alone would)."""
        plan = seq.inp.speculation
        methods = self.methods_of(plan)
        if not plan.enabled or not methods or seq in self._states:
            return
        states = self._states[seq] = {}
        for method in methods:
            impl = self.methods[method]
            extra = {"grammar": seq.grammar} if impl.reads_grammar else {}
            state = states[method] = impl.admit(
                seq.request_id, seq.tokens, seq.inp.sampling,
                dataclasses.replace(plan, method=method), **extra)
            if seq.num_computed:  # admitted on cached blocks
                state.restore(seq.block_keys, seq.num_computed)

    def reuse_limit(self, seq: SequenceState, keys: Seq[bytes]) -> int:
        """How many of its cached leading blocks the sequence's method (or its hybrid's
        in-target components, the fewest of theirs) lets it reuse."""
        limit = len(keys)
        if seq.inp.speculation.enabled:
            for method in self.methods_of(seq.inp.speculation):
                limit = min(limit, self.methods[method].reuse_limit(keys))
        return limit

    def committed(self, seq: SequenceState) -> None:
        """The sequence's blocks up to len(seq.block_keys) are final (its states may keep
        their rows for them)."""
        for state in self._states.get(seq, {}).values():
            state.offer(seq.block_keys)

    def stats(self) -> dict[str, dict[str, float]]:
        """Each method's counters and gauges (InTargetMethod.stats)."""
        return {name: m.stats() for name, m in self.methods.items()}

    def wants_argmax(self, seq: SequenceState) -> bool:
        """Whether the sequence's states learn from the target's argmax at its nodes."""
        return seq in self._states

    def wants_features(self, seq: SequenceState) -> bool:
        """Whether one of the sequence's states reads the target's features."""
        return any(state.features for state in self._states.get(seq, {}).values())

    def prefilled(self, seq: SequenceState, features, position: int) -> None:
        for state in self._states.get(seq, {}).values():
            state.prefilled(features, position)

    def propose(self, group: list[Scheduled], method: str
                ) -> "dict[SequenceState, list[int] | Draft]":
        """Candidates of `method` for each scheduled sequence that wants k > 0 (unchecked),
        from the sequence's state of that method; what the states left on the device stays
        there when it names its parts (a DeviceDraft, for the step), the rest comes over in one
        copy after all of them have drafted."""
        out, pending = {}, {}
        members = [s for s in group if method in self._states.get(s.seq, {})]
        got = self.methods[method].propose_many(
            [(self._states[s.seq][method], s.seq.tokens, s.k) for s in members])
        proposed = list(zip(members, got))
        for s, got in proposed:
            if isinstance(got, PendingDraft) and got.ids is not None:
                out[s.seq] = device_draft(s.seq.request_id, got)
                continue
            (pending if isinstance(got, PendingDraft) else out)[s.seq] = got
        if pending:
            out.update(self._resolve(pending))
        return out

    def _resolve(self, pending: "dict[SequenceState, PendingDraft]"
                 ) -> "dict[SequenceState, list[int] | Draft]":
        ints = [t for p in pending.values() for t in p.ints]
        floats = [t for p in pending.values() for t in p.floats]
        device = (ints or floats)[0].device
        fetch = self._fetch.get(device)
        if fetch is None:
            fetch = self._fetch[device] = dev.HostFetch(device)
        got_i, got_f = fetch(ints, floats)
        out, at_i, at_f = {}, 0, 0
        for seq, p in pending.items():
            out[seq] = p.finish(got_i[at_i:at_i + len(p.ints)], got_f[at_f:at_f + len(p.floats)])
            at_i, at_f = at_i + len(p.ints), at_f + len(p.floats)
        return out

    def observe(self, seq: SequenceState, outcome: StepOutcome) -> float | None:
        """The sequence's states learn from its verified step; returns the seconds that took
        (None: the sequence has no in-target state, or each kept the step for its method's
        flush, which is timed there)."""
        total = None
        for method, state in self._states.get(seq, {}).items():
            start = time.perf_counter()
            kept = state.observe(outcome)
            spent = time.perf_counter() - start
            self._observe_s[method] = self._observe_s.get(method, 0.0) + spent
            self.step_observe_s += spent
            if not kept:
                total = (total or 0.0) + spent
        return total

    def flush(self) -> dict[str, tuple[float, int]]:
        """Every method's flush (the start of a step's drafting): per method that learnt, the
        seconds it took and for how many sequences. Priced with the method's drafting (it runs
        inside the step's drafting time, so it is not the step's observe time)."""
        done = {}
        for name, method in self.methods.items():
            start = time.perf_counter()
            n = method.flush()
            if n:
                spent = time.perf_counter() - start
                self._observe_s[name] = self._observe_s.get(name, 0.0) + spent
                done[name] = (spent, n)
        return done

    def take_observe_seconds(self, method: str) -> float:
        """What `method`'s states spent in observe since last asked: work of the method's own
        (an EAGLE head's layer over the kept rows), priced with its drafting, not the step's."""
        return self._observe_s.pop(method, 0.0)

    def take_step_observe_seconds(self) -> float:
        """Every method's observe seconds since last asked (out of a step's measured cost)."""
        spent, self.step_observe_s = self.step_observe_s, 0.0
        return spent

    def free(self, seq: SequenceState) -> None:
        for state in self._states.pop(seq, {}).values():
            state.free()
