"""scripts/eagle_ttt.py: the training-time test's single forward computes what drafting computes.

- step s of `ttt_forward` at row j equals the head's own drafting code (EagleSequence) run from
  root row j with the record's tokens fed back, row for row: training sees exactly the states
  the head drafts from;
- `chain_hits` (the acceptance the evaluation reports) equals greedy chains drafted by
  EagleSequence at every root, on a record whose answer the head partly drafts itself (so the
  count is not trivially zero);
- the held-out prompts share no long word sequence with the training categories' instructions
  and worked examples, and the overlap check catches a near-copy.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "tests" / "verifier_service"))

import eagle_data  # noqa: E402
import eagle_heldout  # noqa: E402
import eagle_topics  # noqa: E402
import eagle_ttt  # noqa: E402
from eagle_testlib import HEAD_DIM, HEADS, INTER, KV, VOCAB, H, random_weights  # noqa: E402

from verifier_service.methods.eagle.checkpoint import EagleSpec, EagleWeights, canonical_names  # noqa: E402
from verifier_service.methods.eagle.head import EagleHead  # noqa: E402

T, P = 18, 5


def random_head(seed: int = 3) -> EagleHead:
    w = canonical_names(random_weights(3, seed=seed, draft_vocab=64))
    spec = EagleSpec(3, H, HEADS, KV, HEAD_DIM, INTER, VOCAB, 64, H, aux_layer_ids=(0, 1, 2))
    embed = torch.randn(VOCAB, H, generator=torch.Generator().manual_seed(seed)) * 0.5
    return EagleHead(spec, EagleWeights(**w), embed, dtype=torch.float64)


def self_drafted_record(head: EagleHead, seed: int = 4) -> dict:
    """Random features; the answer's tokens are the head's own first drafts at every root,
    except every fourth, which is random (so chains both hold and break)."""
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(T, 3 * H, generator=g, dtype=torch.float64)
    tokens = torch.randint(0, VOCAB, (T + 1,), generator=g)
    seq = head.new_sequence(T + 8)
    seq.advance(feats[:P], tokens[1:P + 1])
    for j in range(P - 1, T - 1):
        if j > P - 1:
            seq.advance(feats[j:j + 1], tokens[j + 1:j + 2])
        if j % 4:
            tokens[j + 2] = seq.chain(1)[0]
    return {"feats": feats, "tokens": tokens, "prompt_len": P}


def inference_outputs(head: EagleHead, rec: dict, j: int, steps: int) -> list[torch.Tensor]:
    """Outputs of drafting from root row j with the record's tokens fed back (depth 0: the
    root row itself)."""
    feats, tokens = rec["feats"], rec["tokens"]
    seq = head.new_sequence(T + steps + 4)
    seq.advance(feats[:j + 1], tokens[1:j + 2])
    outs, hidden = [seq.root_out], seq.root_out
    for s in range(1, steps):
        hidden = seq._step(tokens[j + s + 1].view(1), hidden, s)
        outs.append(hidden)
    return outs


def check_ttt_equals_drafting(head, rec, steps: int = 4) -> None:
    ttt = eagle_ttt.ttt_forward(head, rec["feats"], rec["tokens"], steps)
    for j in range(0, T - steps):
        for s, out in enumerate(inference_outputs(head, rec, j, steps)):
            torch.testing.assert_close(ttt[s][j], out, atol=1e-9, rtol=1e-9)


def test_training_time_test_computes_what_drafting_computes():
    head = random_head()
    check_ttt_equals_drafting(head, self_drafted_record(head))


def test_chain_hits_are_the_drafted_chains_acceptance():
    head = random_head()
    rec = self_drafted_record(head)
    k = 3
    hits = eagle_ttt.chain_hits(head, rec, k)
    tokens = rec["tokens"].tolist()
    want = []
    for j in range(P - 1, T - k):
        seq = head.new_sequence(T + 8)
        seq.advance(rec["feats"][:j + 1], rec["tokens"][1:j + 2])
        chain = seq.chain(k).tolist()
        ok, row = True, []
        for i in range(k):
            ok = ok and chain[i] == tokens[j + 2 + i]
            row.append(ok)
        want.append(row)
    assert hits.tolist() == want
    assert 0 < hits[:, 0].float().mean() < 1  # chains both held and broke


def test_heldout_prompts_are_clear_of_the_training_templates():
    held = eagle_heldout.CHAT + eagle_heldout.CODE
    assert len(eagle_heldout.CHAT) == len(eagle_heldout.CODE) == 40
    assert len(set(held)) == len(held)
    for cat in eagle_topics.CATEGORIES:
        for text in [cat.instruction] + [req for _, req in cat.examples]:
            assert not eagle_data.overlaps(text, held), text


@pytest.mark.parametrize("text,hit", [
    ("Why does ice float on water?", True),
    ("Could you tell me why does ice float on water, please?", True),
    ("Write a Python function that returns the sum of the digits of a big integer.", True),
    ("Write a Python function that returns the product of two matrices.", False),
    ("Why do boats float?", False),
])
def test_the_overlap_check_catches_near_copies(text, hit):
    assert eagle_data.overlaps(text, eagle_heldout.CHAT + eagle_heldout.CODE) is hit


def test_the_equivalence_check_fails_without_the_drafted_rows_keys(monkeypatch):
    import planted_bugs as bug

    head = random_head()
    rec = self_drafted_record(head)
    bug.ttt_drafted_rows_without_their_own_keys(monkeypatch)
    with pytest.raises(AssertionError):
        check_ttt_equals_drafting(head, rec)


def test_a_trained_head_saves_and_loads_as_it_trained(tmp_path):
    """eagle_fit's parameters (feature scaling folded into fc) written by save_eagle3 load back
    through the verifier's loader and draft the same chain (fp16 weights, float32 compute)."""
    import eagle_fit

    from verifier_service.methods.eagle.checkpoint import save_eagle3

    spec = EagleSpec(3, H, HEADS, KV, HEAD_DIM, INTER, VOCAB, 48, H, aux_layer_ids=(0, 1, 2))
    g = torch.Generator().manual_seed(5)
    target = {"embed": torch.randn(VOCAB, H, generator=g) * 0.5,
              "head": torch.randn(VOCAB, H, generator=g) * 0.5, "norm": torch.ones(H)}
    ids = sorted(torch.randperm(VOCAB, generator=g)[:48].tolist())
    d2t, t2d, _ = eagle_fit.draft_maps(ids, VOCAB)
    scale = torch.rand(3 * H, generator=g) * 10 + 0.01
    params = eagle_fit.HeadParams(spec, target, ids, scale)
    with torch.no_grad():
        for p in params.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
        params.fc.mul_(20)
    trained = EagleHead(spec, params.weights(d2t, t2d), target["embed"])
    save_eagle3(tmp_path / "head", spec, params.weights(d2t, t2d))
    loaded = EagleHead.from_dir(tmp_path / "head", target["embed"])
    feats = torch.randn(12, 3 * H, generator=g)
    nxt = torch.randint(0, VOCAB, (12,), generator=g)
    chains = []
    for head in (trained, loaded):
        seq = head.new_sequence(32)
        with torch.no_grad():
            seq.advance(feats, nxt)
            chains.append(seq.chain(3).tolist())
            torch.testing.assert_close(seq.root_logits.float(), chains_logits(trained, feats, nxt),
                                       atol=0.05, rtol=0.01)
    assert chains[0] == chains[1]


def chains_logits(head, feats, nxt):
    seq = head.new_sequence(32)
    with torch.no_grad():
        seq.advance(feats, nxt)
    return seq.root_logits.float()
