"""The per-request speculation decision.

`auto` is where load-aware switching plugs in (speculation costs verifier compute that a busy
batch needs for other requests); today `auto` means on whenever a proposer is served.
"""

from __future__ import annotations

from splitspec.params import SpeculationPlan, SpeculationRequest, resolve_speculation
from protos import common_pb2, verifier_pb2


class SpeculationPolicy:
    def decide(self, req: SpeculationRequest,
               info: verifier_pb2.VerifierInfo) -> SpeculationPlan:
        methods = tuple(p.method for p in info.proposers)
        return resolve_speculation(req, methods, info.default_num_speculative_tokens,
                                   info.max_num_speculative_tokens, auto_on=True)

    @staticmethod
    def to_pb(plan: SpeculationPlan) -> common_pb2.SpeculationConfig:
        if not plan.enabled:
            return common_pb2.SpeculationConfig(mode=common_pb2.SPECULATION_MODE_OFF)
        return common_pb2.SpeculationConfig(mode=common_pb2.SPECULATION_MODE_ON,
                                            method=plan.method, num_speculative_tokens=plan.k)
