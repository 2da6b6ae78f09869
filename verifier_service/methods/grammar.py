"""The grammar as a drafter: an in-target method that drafts the tokens a structured request's
grammar forces next.

After `{"name":` a JSON schema leaves the model no choice for a while (`"`, then whatever the
schema says); xgrammar finds that text (its jump-forward string) from the request's matcher,
which has accepted exactly the committed output. The text is tokenized with the served tokenizer
and drafted as a chain (deterministic: one-hot q), verified like any other draft: the target's
rows are masked by the same grammar, so a forced token is accepted unless the model would spell
the same text with other tokens. So the text is respelled as the target spelled it before
(verifier_service/methods/forced_spelling.py: learned from the tokens it wrote where forced
ones were drafted, shared by every request), its last token is held back where a longer
token starts with it (the model's next token may cross the forced text's end) unless the target
was seen writing it alone there, and only tokens the grammar accepts in turn are drafted
(verifier_service/grammar/matcher.py `forced_tokens`).

A request without a structure drafts nothing with it. It reads the request's grammar state
(`reads_grammar`: InTargetDrafts.admit hands it over) and never moves it.

Registered as `grammar` (capability structured_only): the gateway's policy offers it, alone or
first in a hybrid with a proposer (hybrid:grammar+suffix), to structured requests only
(gateway/policy.py). Counted: forced tokens drafted and, of those, accepted (the tokens the step
then committed, read from the next outcome).
"""

from __future__ import annotations

from typing import Sequence as Seq

from splitspec.params import SamplingParams, SpeculationPlan
from verifier_service.methods.forced_spelling import Spellings
from verifier_service.methods.in_target import InTargetMethod, InTargetState, StepOutcome

__all__ = ["GrammarMethod", "extendable_ids"]


def extendable_ids(vocab: Seq[bytes]) -> frozenset[int]:
    """The ids whose text some longer token starts with (vocab: each id's bytes). Sorted, a
    string's extensions come right after it and its equals."""
    order = sorted(range(len(vocab)), key=lambda i: vocab[i])
    out: set[int] = set()
    start = 0
    while start < len(order):
        text = vocab[order[start]]
        end = start + 1
        while end < len(order) and vocab[order[end]] == text:
            end += 1
        if end < len(order) and vocab[order[end]].startswith(text):
            out.update(order[start:end])
        start = end
    return frozenset(out)


class GrammarMethod(InTargetMethod):
    """One per verifier; the served tokenizer loaded on the first structured request."""

    reads_grammar = True

    def __init__(self, vocab_size: int, model: str, trust_remote_code: bool = False,
                 load_format: str = "auto"):
        self.vocab_size = vocab_size
        self._source = (model, trust_remote_code, load_format)
        self._tokenizer = None
        self._spellings: Spellings | None = None
        self.forced_tokens = 0  # drafted, since start
        self.forced_accepted = 0  # of those, committed by the step that verified them

    @classmethod
    def from_verifier(cls, vocab_size: int, config=None) -> "GrammarMethod | None":
        if config is None:
            return None
        return cls(vocab_size, config.model, config.trust_remote_code, config.load_format)

    def admit(self, request_id: str, tokens: Seq[int], sampling: SamplingParams,
              plan: SpeculationPlan, grammar=None) -> InTargetState:
        return _ForcedDrafts(self, grammar)

    def encode(self, text: str) -> list[int]:
        return self._served()[0].encode(text, add_special_tokens=False)

    @property
    def spellings(self) -> Spellings:
        """How the target spells forced text (learned by every request's steps)."""
        return self._served()[1]

    def _served(self):
        if self._tokenizer is None:
            import xgrammar as xgr

            from splitspec.modelio import load_tokenizer

            self._tokenizer = load_tokenizer(*self._source)
            info = xgr.TokenizerInfo.from_huggingface(self._tokenizer,
                                                      vocab_size=self.vocab_size)
            vocab = info.decoded_vocab
            self._spellings = Spellings(vocab, self.encode, extendable_ids(vocab))
        return self._tokenizer, self._spellings

    def stats(self) -> dict[str, float]:
        return {"forced_tokens_total": self.forced_tokens,
                "forced_tokens_accepted_total": self.forced_accepted}


class _ForcedDrafts(InTargetState):
    def __init__(self, method: GrammarMethod, grammar):
        self.method, self.grammar = method, grammar
        # the last step's forced tokens, the token held back after them and whether they
        # spell the whole forced text, until its outcome
        self._drafted: list[int] = []
        self._held: int | None = None
        self._whole = False
        self._proposed = False
        self._before: int | None = None  # the token the forced ones follow

    def propose(self, tokens: Seq[int], k: int) -> list[int]:
        self._drafted, self._held, self._proposed = [], None, False
        if self.grammar is None or self.grammar.terminated:
            return []
        spellings = self.method.spellings
        before = self._before = int(tokens[-1]) if len(tokens) else None
        forced, self._held, self._whole = self.grammar.forced_tokens(
            lambda text: spellings.spell(text, before), k)
        self.method.forced_tokens += len(forced)
        self._drafted, self._proposed = forced, True
        return forced

    def observe(self, outcome: StepOutcome) -> None:
        """Of the forced tokens drafted, those the step committed (its emitted tokens start
        with them; a rejected one-hot draft is never the recovered token, so a match is an
        acceptance, also where a hybrid's merge verified them)."""
        accepted = 0
        for forced, emitted in zip(self._drafted, outcome.emitted):
            if forced != emitted:
                break
            accepted += 1
        accepted = min(accepted, outcome.num_accepted)
        self.method.forced_accepted += accepted
        if self._proposed:  # what the target wrote where the grammar forced the text
            self.method.spellings.learn(self._before, self._drafted, self._held, self._whole,
                                        outcome.emitted, accepted)
        self._drafted, self._held, self._proposed = [], None, False

    def free(self) -> None:
        self.grammar = None
