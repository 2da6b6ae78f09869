"""Per-request output bookkeeping: incremental detokenization and stop conditions.

Text is decoded incrementally with a short window of earlier tokens as context, so that
tokenizers that drop a leading space at the start of a decode (SentencePiece) and multi-byte
characters split over tokens both come out right. Stop strings are searched in the output text;
up to (longest stop string - 1) characters are held back while streaming so a stop string is
never partly sent.
"""

from __future__ import annotations

from dataclasses import dataclass

from splitspec.params import StoppingCriteria

_CONTEXT_TOKENS = 5


@dataclass
class Appended:
    token_ids: list[int]  # tokens kept from this append (after stop truncation)
    text: str  # new text that may be sent now
    finish_reason: str | None  # "stop" | "length" | None


class OutputTracker:
    def __init__(self, tokenizer, prompt_ids: list[int], stopping: StoppingCriteria,
                 eos_token_ids: set[int], max_new_tokens: int, min_tokens: int = 0):
        self._tok = tokenizer
        self._min_tokens = min_tokens  # no stop string ends the output before this many
        self._stopping = stopping
        self._stop_ids = set(stopping.stop_token_ids)
        if not stopping.ignore_eos:
            self._stop_ids |= eos_token_ids
        self._max_new = max_new_tokens
        self._ids = list(prompt_ids[-_CONTEXT_TOKENS:])  # decode window: context + output
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._holdback = max((len(s) for s in stopping.stop), default=1) - 1
        self.output_ids: list[int] = []
        self.text = ""  # all output text decoded so far (truncated at a stop string)
        self._sent = 0  # characters of self.text already handed out
        self.finish_reason: str | None = None

    @property
    def stop_token_ids(self) -> frozenset[int]:
        """The tokens that end the output (stop_token_ids, and EOS unless ignore_eos)."""
        return frozenset(self._stop_ids)

    def append(self, token_ids: list[int]) -> Appended:
        kept: list[int] = []
        for t in token_ids:
            if self.finish_reason is not None:
                break
            kept.append(t)
            self.output_ids.append(t)
            if t in self._stop_ids:
                self.finish_reason = "stop"
            else:
                self._decode_next(t)
                if (self._stopping.stop and len(self.output_ids) >= self._min_tokens
                        and self._find_stop()):
                    self.finish_reason = "stop"
            if self.finish_reason is None and len(self.output_ids) >= self._max_new:
                self.finish_reason = "length"
        return Appended(kept, self._take_text(), self.finish_reason)

    def finish(self, reason: str) -> str:
        """End the output here (a structured output is complete): the text still held back
        for stop strings, now due."""
        self.finish_reason = reason
        return self._take_text()

    def resume(self, token_ids: list[int], sent_chars: int) -> Appended:
        """Continue a request another replica started: replay the output it streamed (the
        same decode calls, so the same text and stop checks as had it been generated here),
        count the first `sent_chars` characters as sent, and return what is still due: a
        held-back tail, or everything when the replayed tokens already end the request."""
        appended = self.append(token_ids)
        self._sent = min(sent_chars, len(self.text))
        return Appended(appended.token_ids[:0], self._take_text(), self.finish_reason)

    def _decode_next(self, token: int) -> None:
        self._ids.append(token)
        prefix = self._tok.decode(self._ids[self._prefix_offset:self._read_offset],
                                  skip_special_tokens=True)
        full = self._tok.decode(self._ids[self._prefix_offset:], skip_special_tokens=True)
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.text += full[len(prefix):]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)

    def _find_stop(self) -> bool:
        start = max(0, self._sent - self._holdback)
        hits = [i for s in self._stopping.stop if (i := self.text.find(s, start)) >= 0]
        if not hits:
            return False
        self.text = self.text[:min(hits)]
        return True

    def _take_text(self) -> str:
        end = len(self.text) if self.finish_reason else max(self._sent,
                                                            len(self.text) - self._holdback)
        delta = self.text[self._sent:end]
        self._sent = end
        return delta
