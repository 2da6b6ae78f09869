"""Unit tests of the MLP speculator module: shapes, recurrence, save/load round trip,
determinism."""

import json

import pytest
import torch

from proposer_service.mlp.speculator import MLPSpeculator, MLPSpeculatorConfig


def make(tie: bool = True, n_predict: int = 3, seed: int = 0) -> MLPSpeculator:
    torch.manual_seed(seed)
    cfg = MLPSpeculatorConfig(
        emb_dim=24, inner_dim=16, vocab_size=50, n_predict=n_predict, tie_weights=tie
    )
    return MLPSpeculator(cfg).eval()


@pytest.mark.parametrize("tie", [True, False])
def test_shapes(tie):
    m = make(tie)
    hidden, last = torch.randn(4, 24), torch.randint(0, 50, (4,))
    toks = m.generate_suggestions(hidden, last)
    assert toks.shape == (4, 3) and toks.dtype == torch.long
    assert int(toks.min()) >= 0 and int(toks.max()) < 50
    sampled, probs = m.sample_suggestions(
        hidden, last, k=2, generator=torch.Generator().manual_seed(0)
    )
    assert sampled.shape == (4, 2) and probs.shape == (4, 2, 50)
    torch.testing.assert_close(probs.sum(-1), torch.ones(4, 2))
    logits = m(torch.randn(2, 7, 24), torch.randint(0, 50, (2, 7, 3)))
    assert logits.shape == (3, 2, 7, 50)


def test_tied_weights_are_shared_and_recurrence_extends():
    tied, untied = make(True, n_predict=4), make(False, n_predict=4)
    assert len(tied.emb) == len(tied.head) == len(tied.ln) == 1 and len(tied.proj) == 2
    assert len(untied.emb) == len(untied.head) == 4 and len(untied.proj) == 4
    assert sum(p.numel() for p in tied.parameters()) < sum(p.numel() for p in untied.parameters())
    hidden, last = torch.randn(2, 24), torch.randint(0, 50, (2,))
    # tied: k beyond n_predict reuses the shared head, and the first n_predict tokens are unchanged
    assert torch.equal(
        tied.generate_suggestions(hidden, last, k=8)[:, :4], tied.generate_suggestions(hidden, last)
    )
    with pytest.raises(ValueError):
        untied.generate_suggestions(hidden, last, k=5)


def test_greedy_matches_teacher_forced_argmax():
    """Feeding the greedy tokens back teacher-forced reproduces the same argmaxes head by head."""
    m = make(False)
    hidden, last = torch.randn(3, 24), torch.randint(0, 50, (3,))
    greedy = m.generate_suggestions(hidden, last)  # [3, 3]
    inputs = torch.cat([last[:, None], greedy[:, :-1]], 1)[:, None, :]  # [B, T=1, n]
    logits = m(hidden[:, None], inputs)  # [n, B, 1, V]
    assert torch.equal(logits.argmax(-1)[:, :, 0].T, greedy)


def test_greedy_is_deterministic():
    m = make()
    hidden, last = torch.randn(5, 24), torch.randint(0, 50, (5,))
    assert torch.equal(m.generate_suggestions(hidden, last), m.generate_suggestions(hidden, last))
    assert torch.equal(
        make(seed=0).generate_suggestions(hidden, last), m.generate_suggestions(hidden, last)
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_save_load_round_trip(tmp_path, dtype):
    m = make().to(dtype)
    m.config.target_model = "models/target"
    m.save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert (
        raw["model_type"] == "mlp_speculator" and raw["emb_dim"] == 24 and raw["vocab_size"] == 50
    )
    assert raw["n_predict"] == 3 and raw["torch_dtype"] == str(dtype).removeprefix("torch.")
    loaded = MLPSpeculator.from_pretrained(tmp_path)
    assert loaded.config == m.config
    for (k1, v1), (k2, v2) in zip(m.state_dict().items(), loaded.state_dict().items()):
        assert k1 == k2 and v2.dtype == dtype and torch.equal(v1, v2)
    hidden, last = torch.randn(2, 24), torch.randint(0, 50, (2,))
    m32, l32 = m.float(), MLPSpeculator.from_pretrained(tmp_path, dtype=torch.float32)
    assert torch.equal(
        m32.generate_suggestions(hidden, last), l32.generate_suggestions(hidden, last)
    )


def test_training_losses_decrease():
    """A few optimiser steps on a fixed batch lower every head's loss (the graph is trainable)."""
    m = make().train()
    h, s = torch.randn(2, 10, 24), torch.randint(0, 50, (2, 14))
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    first = [head_loss.item() for head_loss in m.training_losses(h, s, 0, 10)]
    for _ in range(30):
        loss = sum(m.training_losses(h, s, 0, 10))
        opt.zero_grad()
        loss.backward()
        opt.step()
    last = [head_loss.item() for head_loss in m.training_losses(h, s, 0, 10)]
    assert all(b < a for a, b in zip(first, last))
