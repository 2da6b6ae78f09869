"""The per-request speculation decision.

`auto` is where load-aware switching plugs in (speculation costs verifier compute that a busy
batch needs for other requests); today `auto` means on whenever a proposer is served.

Each decision has a reason, counted in splitspec_policy_decisions_total{decision, reason}:
  requested_on / requested_off   the request said mode on / off
  requested_k0                   the request asked for k = 0
  auto_on / auto_off             mode auto, and the policy chose speculation / plain decoding
  no_proposer                    mode auto, but the deployment serves no proposer
"""

from __future__ import annotations

from protos import common_pb2, verifier_pb2
from splitspec.params import (
    SpeculationMode,
    SpeculationPlan,
    SpeculationRequest,
    resolve_speculation,
)


class SpeculationPolicy:
    def decide(self, req: SpeculationRequest,
               info: verifier_pb2.VerifierInfo) -> SpeculationPlan:
        return self.decide_with_reason(req, info)[0]

    def decide_with_reason(self, req: SpeculationRequest, info: verifier_pb2.VerifierInfo
                           ) -> tuple[SpeculationPlan, str]:
        methods = tuple(p.method for p in info.proposers)
        plan = resolve_speculation(req, methods, info.default_num_speculative_tokens,
                                   info.max_num_speculative_tokens, auto_on=True)
        return plan, decision_reason(req, plan, bool(methods))

    @staticmethod
    def to_pb(plan: SpeculationPlan) -> common_pb2.SpeculationConfig:
        if not plan.enabled:
            return common_pb2.SpeculationConfig(mode=common_pb2.SPECULATION_MODE_OFF)
        return common_pb2.SpeculationConfig(mode=common_pb2.SPECULATION_MODE_ON,
                                            method=plan.method, num_speculative_tokens=plan.k)


def decision_reason(req: SpeculationRequest, plan: SpeculationPlan, served: bool) -> str:
    if req.mode is SpeculationMode.OFF:
        return "requested_off"
    if req.num_speculative_tokens == 0:
        return "requested_k0"
    if req.mode is SpeculationMode.ON:
        return "requested_on"
    return "auto_on" if plan.enabled else ("no_proposer" if not served else "auto_off")
