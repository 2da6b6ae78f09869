"""Whether to ask a method's proposer to draft ahead (drafting ahead), decided by what it
measurably costs.

Drafting ahead pays when the proposer has cores of its own; on a machine it shares with the
verifier it takes cores from the target's forward and can make every step slower. So with
`--draft-ahead auto` (the default) the engine measures, per method, the seconds per emitted token of
the steps that asked it, with drafting ahead and without: it starts with drafting ahead, tries
the other setting for PROBE steps at the end of every period (the first period is short, then
PERIOD steps), and keeps the cheaper one (the other must win by MARGIN, against noise). `on` and
`off` pin the setting. Losslessness does not depend on it: a draft is verified either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MODES = ("auto", "on", "off")
FIRST_PERIOD, PERIOD, PROBE = 48, 256, 24  # steps per period (first, then every), probe steps
MARGIN = 0.05  # the setting tried must be this much cheaper per token to be chosen


@dataclass
class _Method:
    steps: int = 0
    period_end: int = FIRST_PERIOD
    choice: bool = True  # draft ahead
    # per setting (True: ahead) in the current period: [seconds, tokens]
    cost: dict[bool, list[float]] = field(default_factory=lambda: {True: [0.0, 0.0],
                                                                   False: [0.0, 0.0]})


class AheadPolicy:
    def __init__(self, mode: str = "auto"):
        if mode not in MODES:
            raise ValueError(f"draft_ahead must be one of {', '.join(MODES)}, not {mode!r}")
        self.mode = mode
        self._methods: dict[str, _Method] = {}
        self.switches = 0  # times auto changed its choice (for tests and logs)

    def _state(self, method: str) -> _Method:
        return self._methods.setdefault(method, _Method())

    def use(self, method: str) -> bool:
        """Ask this step's proposer of `method` to draft ahead?"""
        if self.mode != "auto":
            return self.mode == "on"
        st = self._state(method)
        probing = st.steps >= st.period_end - PROBE
        return not st.choice if probing else st.choice

    def choice(self, method: str) -> bool:
        """The setting auto currently keeps for `method` (outside its probes)."""
        return self.mode == "on" if self.mode != "auto" else self._state(method).choice

    def record(self, method: str, ahead: bool, seconds: float, tokens: int) -> None:
        """One step that asked `method` (with or without drafting ahead) took `seconds` and
        emitted `tokens` for its sequences."""
        if self.mode != "auto" or tokens <= 0:
            return
        st = self._state(method)
        st.steps += 1
        cost = st.cost[ahead]
        cost[0] += seconds
        cost[1] += tokens
        if st.steps < st.period_end:
            return
        (kept_s, kept_t), (other_s, other_t) = st.cost[st.choice], st.cost[not st.choice]
        if kept_t and other_t and other_s / other_t < (1 - MARGIN) * kept_s / kept_t:
            st.choice = not st.choice
            self.switches += 1
        st.period_end = st.steps + PERIOD
        st.cost = {True: [0.0, 0.0], False: [0.0, 0.0]}
