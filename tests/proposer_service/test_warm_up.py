"""Every registered proposer warms up (greedy, sampled, seeded, a tree) in a session of its own
and keeps no sequence afterwards."""

from __future__ import annotations

import pytest

from proposer_service.config import ProposerConfig
from proposer_service.server import build_proposer
from splitspec.methods import proposer_methods


@pytest.mark.parametrize("method", sorted(proposer_methods()))
def test_each_proposer_warms_up(method, learned_models):
    target, draft, speculator = learned_models
    model = {"draft": draft, "mlp": speculator}.get(method, "")
    extra = {"tokenizer": target} if method == "mlp" else {}
    proposer = build_proposer(ProposerConfig(method=method, model=model, device="cpu",
                                             threads=1, **extra))
    proposer.warm_up()
    session = proposer.open_session()  # a fresh session knows nothing of the warm-up's
    assert session.propose([]) == []
