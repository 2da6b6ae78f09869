"""What every proposer implements, and the per-stream history bookkeeping they share
(splitspec/history_store.py).

A verifier opens one Propose stream per proposer; each stream gets its own `ProposerSession`,
which keeps the drafting state of that verifier's sequences, keyed by sequence id.
"""

from __future__ import annotations

import abc
import threading
from typing import TYPE_CHECKING, Callable, Sequence, TypeVar

from splitspec.history_store import HistoryStore
from splitspec.proposal import AheadDraft, Draft, ProposerDescription, SequenceStep

if TYPE_CHECKING:
    from proposer_service.config import ProposerConfig

W = TypeVar("W")


class ProposerSession(abc.ABC):
    @abc.abstractmethod
    def propose(self, steps: list[SequenceStep]) -> list[Draft]:
        """Apply each step's new tokens, then guess up to step.k draft nodes per sequence: a
        chain, or, when step.max_branch > 1, a tree whose nodes have at most that many children
        (Draft.parents; proposer_service/tree_builder.py builds them)."""

    @abc.abstractmethod
    def release(self, seq_ids: list[str]) -> None:
        """Forget sequences that ended."""

    def close(self) -> None:
        """The stream ended: release everything."""

    # -- drafting ahead (proposers whose description says drafts_ahead) ---------------------

    def has_ahead_work(self) -> bool:
        """Whether the last propose() left sequences to draft ahead for (steps that asked)."""
        return False

    def draft_ahead(self, cancel: threading.Event) -> None:
        """Draft the next step ahead for the likely outcomes of the last one; runs in a worker
        thread between two propose() calls and stops early (keeping nothing) once cancel is
        set."""

    def ahead_may_hit(self, steps: list[SequenceStep]) -> bool:
        """Whether some step's outcome could be among those being drafted ahead (else the
        drafting ahead is cancelled). Called before propose(steps), reads no shared state that
        draft_ahead writes."""
        return False

    def ahead_drafts(self) -> list[AheadDraft]:
        """What the last finished draft_ahead made, one entry per (sequence, outcome): pushed
        to a verifier that takes pushes. A step whose message then matches an entry must get
        exactly that draft from propose() (the verifier already verifies it)."""
        return []


class Proposer(abc.ABC):
    # the size of the target's hidden state a proposer conditions on (0: none): the warm-up's
    # dummy input
    warm_hidden_size: int = 0
    # further history lengths drafted greedily at warm-up (a draft model on an accelerator: its
    # prefill kernels specialize on the length, compiled at first use)
    warm_lengths: tuple[int, ...] = ()
    # what a device that captures graphs drafted eagerly all the same (splitspec/graphs.py's
    # EagerFallbacks), for proposers that capture; exported as a metric by reason
    fallbacks = None

    def warm_up(self) -> None:
        """Draft for a short dummy history, greedy and sampled, chains and trees, in a session
        of its own, before the service reports SERVING: lazy setup (allocator growth, the first
        calls of every kernel) is not paid by the first clients' steps."""
        import torch

        from splitspec.params import SamplingParams

        desc = self.describe()
        k = max(1, min(desc.max_num_speculative_tokens, 8))
        vocab = desc.vocab_size or 100
        history = [i % vocab for i in range(3, 19)] * 2
        hidden = torch.zeros(self.warm_hidden_size) if self.warm_hidden_size else None
        session = self.open_session()
        try:
            plans = [(SamplingParams(temperature=0.0), 1), (SamplingParams(temperature=1.0), 1),
                     (SamplingParams(temperature=1.0, seed=1), 1),
                     (SamplingParams(temperature=0.0), 2)]
            for n, (sampling, branch) in enumerate(plans):
                session.propose([SequenceStep(f"warmup-{n}", history, len(history), k, True,
                                              sampling, hidden, max_branch=branch)])
            for n in self.warm_lengths:
                longer = [i % vocab for i in range(3, 3 + n)]
                session.propose([SequenceStep(f"warmup-len-{n}", longer, len(longer), k, True,
                                              SamplingParams(temperature=0.0), hidden)])
        finally:
            session.close()

    @classmethod
    def from_config(cls, config: "ProposerConfig") -> "Proposer":
        """Build from the proposer process's flags (SystemExit with one line on bad ones).
        Every method the registry names implements it; in-process test doubles need not."""
        raise NotImplementedError(f"{cls.__name__} cannot be served by a proposer process")

    @abc.abstractmethod
    def describe(self) -> ProposerDescription: ...

    @abc.abstractmethod
    def open_session(self) -> ProposerSession: ...


def load_learned(cls, config: "ProposerConfig"):
    """The shared loader of model-backed proposers: threads, device, dtype, one-line errors."""
    import torch

    from splitspec.device import resolve_device, resolve_dtype

    if not config.model:
        raise SystemExit(f"error: --method {config.method} needs --model DIR")
    if config.threads > 0:
        torch.set_num_threads(config.threads)
    device = resolve_device(config.device)
    extra = {}
    if config.load_format != "auto":
        if config.method != "draft":
            raise SystemExit(f"error: --load-format {config.load_format} serves --method draft "
                             "only")
        extra = {"load_format": config.load_format, "load_seed": config.load_seed}
    try:
        return cls.load(config.model, device, resolve_dtype(config.dtype, device),
                        tokenizer=config.tokenizer, trust_remote_code=config.trust_remote_code,
                        max_k=config.max_num_speculative_tokens,
                        draft_top_k=config.draft_top_k, max_batch=config.max_batch,
                        idle_timeout_s=config.idle_timeout_s, linear=config.linear,
                        vocab_subset=config.vocab_subset, **extra)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"error: cannot load the {config.method} proposer: {exc}") from None


class HistorySession(ProposerSession):
    """A session that drafts for one sequence at a time from its token history: applies each
    step's delta (RESYNC when it cannot be trusted), then asks `draft`."""

    def __init__(self, idle_timeout_s: float):
        self._store = HistoryStore(idle_timeout_s)

    @abc.abstractmethod
    def draft(self, step: SequenceStep, history: list[int]) -> Draft:
        """Up to step.k nodes continuing `history` (the sequence's tokens after this step), a
        chain unless step.max_branch > 1 allows a tree."""

    def forget(self, seq_ids: list[str]) -> None:
        """Hook: sequences released or gone idle."""

    def propose(self, steps: list[SequenceStep]) -> list[Draft]:
        self.forget(self._store.evict_idle())
        drafts = []
        for step in steps:
            history = self._store.apply(step)
            drafts.append(Draft(step.seq_id, resync=True) if history is None
                          else self.draft(step, history))
        return drafts

    def release(self, seq_ids: list[str]) -> None:
        self._store.release(seq_ids)
        self.forget(seq_ids)

    def close(self) -> None:
        self.forget(list(self._store))
        self._store.clear()


def draft_in_batches(work: Sequence[W], max_batch: int,
                     draft_batch: Callable[[Sequence[W]], list[Draft]]) -> list[Draft]:
    """Run a model-backed proposer over a step's work, at most max_batch sequences per forward."""
    return [d for i in range(0, len(work), max_batch) for d in draft_batch(work[i:i + max_batch])]
