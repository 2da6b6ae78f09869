"""The draft proposer under --load-format dummy: a draft model from its config alone, seeded,
with the byte-level tokenizer of its vocabulary (the fingerprint a dummy target of that
vocabulary has), drafting k tokens; the other learned proposers refuse the flag."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from proposer_service.config import ProposerConfig
from proposer_service.draft.proposer import DraftModelProposer
from splitspec.dummy_weights import byte_tokenizer
from splitspec.modelio import tokenizer_fingerprint

TINY = str(Path(__file__).resolve().parents[2] / "models" / "shapes" / "tiny-llama")


def test_a_dummy_draft_has_the_dummy_targets_fingerprint_and_its_seeds_weights():
    config = ProposerConfig(method="draft", model=TINY, device="cpu", threads=1,
                            load_format="dummy", load_seed=3)
    one, two = DraftModelProposer.from_config(config), DraftModelProposer.from_config(config)
    assert one.fingerprint == tokenizer_fingerprint(byte_tokenizer(512, 2))
    assert one.vocab_size == 512
    for a, b in zip(one.model.parameters(), two.model.parameters()):
        assert torch.equal(a, b)


def test_the_mlp_proposer_refuses_dummy_weights():
    config = ProposerConfig(method="mlp", model=TINY, device="cpu", load_format="dummy")
    from proposer_service.mlp.proposer import MlpSpeculatorProposer
    with pytest.raises(SystemExit, match="--load-format dummy serves --method draft only"):
        MlpSpeculatorProposer.from_config(config)
