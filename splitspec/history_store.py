"""Token histories rebuilt from the deltas of the Propose stream, checked as the wire contract
asks: both ends of the stream keep one (a proposer's session, and the verifier's proposer pool,
which resends a moved sequence's full history itself)."""

from __future__ import annotations

import time

from splitspec.proposal import SequenceStep


class HistoryStore:
    """Token histories rebuilt from deltas, with the consistency check the wire contract asks for.

    `apply` returns the history after the step, or None when the proposer cannot trust it (an
    unknown sequence that was sent as a delta, or a length that disagrees with the verifier's):
    the caller then answers RESYNC and the verifier resends the full history.
    """

    def __init__(self, idle_timeout_s: float = 600.0):
        self._histories: dict[str, list[int]] = {}
        self._last_used: dict[str, float] = {}
        self._idle_timeout_s = idle_timeout_s

    def apply(self, step: SequenceStep) -> list[int] | None:
        if step.full_history:
            history = list(step.new_tokens)
        else:
            history = self._histories.get(step.seq_id)
            if history is None:
                return None
            history.extend(step.new_tokens)
        if len(history) != step.history_len:
            self.release([step.seq_id])
            return None
        self._histories[step.seq_id] = history
        self._last_used[step.seq_id] = time.monotonic()
        return history

    def release(self, seq_ids: list[str]) -> None:
        for sid in seq_ids:
            self._histories.pop(sid, None)
            self._last_used.pop(sid, None)

    def clear(self) -> None:
        self._histories.clear()
        self._last_used.clear()

    def evict_idle(self, now: float | None = None) -> list[str]:
        """Drop sequences not heard of for idle_timeout_s (a verifier that forgot to release)."""
        now = time.monotonic() if now is None else now
        stale = [s for s, t in self._last_used.items() if now - t > self._idle_timeout_s]
        self.release(stale)
        return stale

    def __len__(self) -> int:
        return len(self._histories)

    def __contains__(self, seq_id: str) -> bool:
        return seq_id in self._histories

    def __iter__(self):
        return iter(list(self._histories))
