"""How the target spells the text a grammar forces, learned from what it emitted.

The served tokenizer's encoding of a forced string is not always the target's: a chat model
trained on `"key": "value"` writes compact JSON's `":"` as `":` then `"`, `{"` as `{` then
`"`, `__` as `_` `_`. A forced token the target would spell in pieces is rejected at its first
piece, and the rest of the forced text goes with it. So the grammar drafter respells the
tokenizer's encoding with what the target did before, token by token:

  * a drafted token rejected for a shorter one that starts its text (the target wrote `":`
    where `":"` was drafted) is a spelling of that token: the target's piece, then the rest
    of the token's text encoded (itself respelled where the target split that too);
  * a drafted token accepted is a vote for the token as it is;
  * a token votes are tied or missing for stays as it is.

Votes are kept per token and per (token before, token): the same model writes `{` `"` at the
start of an answer and `{"` after `[`. A token's spelling is read from the votes after the
token before it where there are any, else from all of its votes.

The forced text's last token is held back where a longer token starts with it (the target's
next token may cross the forced text's end), unless the target was seen to write it alone at
the end of a forced text more often than it merged it with what followed.

Acceptance only: a forced draft is verified like any other, so a wrong guess costs a row, never
a token. The tables are the served model's, shared by every request (one per verifier), and
bounded: one counter per token ever drafted (its spellings are pieces that start its text: at
most one per byte of it), and at most MAX_PAIRS counters per (token before, token), after which
new pairs vote for their token alone.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Sequence

__all__ = ["Spellings"]

_DEPTH = 4  # respelled pieces are respelled again, this many times at most
MAX_PAIRS = 1 << 16  # (token before, token) counters kept at most


class Spellings:
    """vocab: each id's bytes (xgrammar's decoded vocabulary); encode: text -> the served
    tokenizer's ids; extendable: the ids some longer token starts with."""

    def __init__(self, vocab: Sequence[bytes], encode: Callable[[str], list[int]],
                 extendable: frozenset[int]):
        self.vocab, self._encode, self.extendable = vocab, encode, extendable
        # token or (token before, token) -> Counter{(ids...): votes}
        self._spellings: dict[int | tuple[int, int], Counter] = {}
        self._pairs = 0
        self._ends: dict[int, list[int]] = {}  # token -> [written alone at the end, merged]

    def spell(self, text: str, before: int | None = None) -> tuple[list[int], int | None]:
        """(the ids to draft for `text` written after the token `before`, the last token held
        back or None)."""
        ids = self._respell(self._encode(text), before, _DEPTH)
        held = ids.pop() if ids and not self.stands_alone(ids[-1]) else None
        return ids, held

    def ends(self, token: int) -> tuple[int, int]:
        """(times the target wrote `token` alone at a forced text's end, times its token there
        went on past the end)."""
        alone, merged = self._ends.get(token, (0, 0))
        return alone, merged

    def stands_alone(self, token: int) -> bool:
        """Whether `token`, ending a forced text, is what the target writes there."""
        alone, merged = self.ends(token)
        if alone or merged:
            return alone > merged
        return token not in self.extendable

    def spelling(self, token: int, before: int | None = None) -> tuple[int, ...]:
        """The target's spelling of `token` after `before` with the most votes ((token,) unless
        another has more than the token itself)."""
        votes = self._spellings.get((before, token)) or self._spellings.get(token)
        if not votes:
            return (token,)
        best, n = votes.most_common(1)[0]
        return (token,) if votes[(token,)] >= n else best

    def learn(self, before: int | None, drafted: Sequence[int], held: int | None, whole: bool,
              emitted: Sequence[int], accepted: int) -> None:
        """One verified step: `drafted` the forced tokens drafted after the token `before`
        (`whole`: they spell all of the forced text, `held` aside), `emitted` the step's
        tokens, `accepted` how many of the drafted ones it committed."""
        prev = before
        for t in drafted[:accepted]:
            self._vote(prev, t, (t,))
            prev = t
        if accepted < len(drafted):
            if accepted < len(emitted):
                rest = list(drafted[accepted:]) + ([held] if held is not None else [])
                if not self._joined(prev, rest, emitted[accepted]):
                    self._rejected(prev, drafted[accepted], emitted[accepted],
                                   whole and held is None and accepted == len(drafted) - 1)
            return
        if accepted >= len(emitted):
            return
        if held is not None:  # what the target wrote where the held token would have been
            after = emitted[accepted]
            if after == held:
                self._ends.setdefault(held, [0, 0])[0] += 1
            elif self._extends(after, held):
                self._ends.setdefault(held, [0, 0])[1] += 1
        elif whole and drafted:  # the text's last token drafted and accepted as it is
            self._ends.setdefault(drafted[-1], [0, 0])[0] += 1

    def _vote(self, before: int | None, token: int, spelling: tuple[int, ...]) -> None:
        self._spellings.setdefault(token, Counter())[spelling] += 1
        if before is None:
            return
        pair = self._spellings.get((before, token))
        if pair is None:
            if self._pairs >= MAX_PAIRS:
                return
            pair = self._spellings[(before, token)] = Counter()
            self._pairs += 1
        pair[spelling] += 1

    def _joined(self, before: int | None, pieces: Sequence[int], emitted: int) -> bool:
        """Whether the target wrote the first pieces of a respelled draft as one token (the
        `{"` drafted as `{` `"` after `[`): a vote for that token as it is, after `before`."""
        want, text = self.vocab[emitted], b""
        for n, t in enumerate(pieces):
            text += self.vocab[t]
            if text == want:
                if n:
                    self._vote(before, emitted, (emitted,))
                return n > 0
            if not want.startswith(text):
                return False
        return False

    def _rejected(self, before: int | None, drafted: int, emitted: int, last: bool) -> None:
        want, got = self.vocab[drafted], self.vocab[emitted]
        if last and self._extends(emitted, drafted):  # the target crossed the text's end
            self._ends.setdefault(drafted, [0, 0])[1] += 1
            return
        if not (len(got) < len(want) and want.startswith(got)):
            return
        rest = want[len(got):]
        try:
            ids = self._encode(rest.decode("utf-8"))
        except UnicodeDecodeError:  # the piece ends inside a character
            return
        if b"".join(self.vocab[t] for t in ids) == rest:
            self._vote(before, drafted, (emitted, *ids))

    def _extends(self, longer: int, token: int) -> bool:
        a, b = self.vocab[longer], self.vocab[token]
        return len(a) > len(b) and a.startswith(b)

    def _respell(self, ids: Sequence[int], before: int | None, depth: int) -> list[int]:
        out: list[int] = []
        for t in ids:
            s = self.spelling(t, out[-1] if out else before)
            out.extend(self._respell(s, out[-1] if out else before, depth - 1)
                       if s != (t,) and depth else s)
        return out
