"""A request inside the verifier: its tokens, cache, speculation plan, stats and output queue."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import torch

from splitspec.goodput import tried_positions
from splitspec.params import GenerationInput
from verifier_service.batching.output import OutputTracker
from verifier_service.kv.cache import BlockTable
from verifier_service.telemetry.stats import RequestTimeline, count_accepted


@dataclass
class StepOutput:
    token_ids: list[int]
    text: str
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    usage: "Usage | None" = None
    # one (logprob, [(token id, logprob), ...]) per token_ids entry, when the request asked
    logprobs: list[tuple[float, list[tuple[int, float]]]] | None = None


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    method: str | None
    num_speculative_tokens: int
    proposed_tokens: int
    accepted_tokens: int
    steps: int
    # accepted_per_position[j]: steps whose draft token j+1 was accepted
    accepted_per_position: list[int] = field(default_factory=list)
    step_counts: list[tuple[int, int]] = field(default_factory=list)  # (drafted, accepted)
    reason: str = ""  # why speculation did not run although planned, e.g. proposer_incompatible
    branch_hits: int = 0  # token trees: steps whose accepted path left a first-ranked child
    num_branches: int = 1  # token trees: the plan's children per node at most (1: chains)
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    rejections: int = 0  # drafts with a rejected token


@dataclass(eq=False)
class SequenceState:
    inp: GenerationInput
    tracker: OutputTracker
    outputs: asyncio.Queue = field(default_factory=asyncio.Queue)
    tokens: list[int] = field(default_factory=list)  # prompt + output, last one not cached yet
    num_computed: int = 0  # leading tokens whose KV is in the cache
    blocks: BlockTable = field(default_factory=BlockTable)
    # prefix caching (batching/prefix_cache.py): the keys of its full blocks so far, their
    # root (model and cache salt), and the prompt tokens its first admission found cached
    block_keys: list[bytes] = field(default_factory=list)
    block_root: bytes | None = None
    cached_tokens: int | None = None
    # Proposer bookkeeping, per proposer method (a hybrid asks several): how many tokens its
    # stream has heard of, on which epoch; absent: none yet (the whole history next).
    proposer_marks: dict[str, tuple[int, int]] = field(default_factory=dict)
    # The target's final hidden state [hidden] at the position that produced the last token;
    # kept only while the sequence's proposer declares that it conditions on it.
    target_hidden: torch.Tensor | None = None
    # bad_words as the served tokenizer writes them (each word alone and after a space)
    bad_words_ids: tuple[tuple[int, ...], ...] = ()
    # a structured request's grammar state (verifier_service/grammar/matcher.py GrammarState):
    # what its committed output matched so far
    grammar: object = None
    speculation_reason: str = ""
    aborted: bool = False
    finished: bool = False
    proposed_tokens: int = 0
    accepted: int = 0
    rejections: int = 0  # drafts with a rejected token (acceptance = accepted / (that + this))
    drafts: int = 0  # non-empty drafts verified
    asked: int = 0  # steps that asked its proposer for a draft
    asked_k: int = 0  # the draft tokens it asked for in the step being run (0: none)
    paused_steps: int = 0  # adaptive k: steps in a row without drafting (adaptive_k.py)
    steps: int = 0
    branch_hits: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    step_counts: list[tuple[int, int]] = field(default_factory=list)
    arrival: float = field(default_factory=time.monotonic)
    timeline: RequestTimeline | None = None

    def __post_init__(self) -> None:
        self.tokens = list(self.inp.prompt_token_ids)
        plan = self.inp.speculation
        self.timeline = RequestTimeline(self.request_id, plan.method if plan.enabled else None,
                                        arrival=time.time(),
                                        prompt_tokens=len(self.inp.prompt_token_ids))

    @property
    def request_id(self) -> str:
        return self.inp.request_id

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.inp.prompt_token_ids)

    def record_draft(self, k: int, accepted: int) -> None:
        self.proposed_tokens += k
        self.accepted += accepted
        if k:
            self.drafts += 1
            self.rejections += tried_positions(k, accepted) - accepted
        self.step_counts.append((k, accepted))
        count_accepted(self.accepted_per_position, k, accepted)

    def usage(self) -> Usage:
        plan = self.inp.speculation
        return Usage(self.num_prompt_tokens, len(self.tracker.output_ids),
                     plan.method if plan.enabled else None, plan.k if plan.enabled else 0,
                     self.proposed_tokens, self.accepted, self.steps,
                     list(self.accepted_per_position), list(self.step_counts),
                     self.speculation_reason, self.branch_hits,
                     plan.num_branches if plan.enabled else 1, self.cached_tokens or 0,
                     self.rejections)
