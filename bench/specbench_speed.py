"""Spec-Bench's arithmetic (bench/specbench.py): what one answer measured, and the speed-up,
#MAT and first-position acceptance of a configuration's answers.

Spec-Bench's evaluation/speed.py (commit fd2c1cd) computes, per question, tokens/s as the
question's new tokens (all its turns) over its wall time (all its turns, each timed from the
call that generates it to its return: prefill included, tokenizing the prompt not), then

    speed-up = mean over questions of the method's tok/s / mean over questions of the baseline's

a ratio of two means of per-question rates (not a mean of per-question ratios, nor total tokens
over total time), over the same questions; "overall" is that over every question of the six
groups. #MAT is the mean over every decoding step of the step's accepted tokens, the steps of
all the questions pooled (np.mean of the concatenated lists): total tokens over total steps.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Turn:
    """One generated answer: the wall seconds from sending its request to its last token
    (prefill included), the seconds to its first token, its token ids, and the target forwards
    that emitted them, with each one's draft nodes and accepted draft tokens when known."""

    seconds: float
    ttft: float
    ids: tuple[int, ...]
    steps: int
    step_drafts: tuple[int, ...] = ()
    step_accepted: tuple[int, ...] = ()
    method: str = ""  # what the step ran (auto's choice); "" for speculation off
    policy_reason: str = ""  # why the gateway's policy chose it (usage.speculation.policy_reason)


@dataclass
class Answer:
    """A question's turns as one configuration answered them (MT-bench: two)."""

    question_id: int
    group: str
    turns: list[Turn] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(len(t.ids) for t in self.turns)

    @property
    def seconds(self) -> float:
        return sum(t.seconds for t in self.turns)

    @property
    def tok_s(self) -> float:
        """Spec-Bench's per-question rate: all turns' tokens over all turns' wall time."""
        return self.tokens / self.seconds


def mean_tok_s(answers: list[Answer]) -> float:
    """The mean over questions of each question's tokens per second."""
    return statistics.fmean(a.tok_s for a in answers)


def speedup(answers: list[Answer], baseline: list[Answer]) -> float:
    """Spec-Bench's speed-up of `answers` over `baseline` on the same questions: the ratio of
    their mean per-question rates."""
    if sorted(a.question_id for a in answers) != sorted(b.question_id for b in baseline):
        raise ValueError("a speed-up compares answers to the same questions")
    return mean_tok_s(answers) / mean_tok_s(baseline)


def mean_accepted_tokens(answers: list[Answer]) -> float:
    """#MAT: tokens emitted per target forward, every step of every answer pooled."""
    return (sum(a.tokens for a in answers)
            / max(sum(t.steps for a in answers for t in a.turns), 1))


def first_position_acceptance(answers: list[Answer]) -> float | None:
    """Of the steps that verified at least one draft node, the share whose first draft token
    (a tree: some depth-1 node) was accepted; None when no step drafted."""
    drafted = accepted = 0
    for a in answers:
        for t in a.turns:
            for d, n in zip(t.step_drafts, t.step_accepted):
                if d:
                    drafted += 1
                    accepted += n > 0
    return accepted / drafted if drafted else None
