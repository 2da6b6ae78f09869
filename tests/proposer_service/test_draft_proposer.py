"""The draft-model proposer's session: deltas, KV rollback, the bonus-token case, batching,
sampled drafts with their sparse q, release and idle eviction, and what Info reports."""

from __future__ import annotations

import sys

import pytest
import torch
from clocks import FakeClock
from tiny_proposer_models import make_random_draft

from kernels.sampling import apply_sampling_params
from proposer_service.base import HistoryStore
from proposer_service.draft.proposer import DraftModelProposer
from proposer_service.sampling import choose_tokens, draft_keys
from splitspec.modelio import load_tokenizer, tokenizer_fingerprint
from splitspec.params import SamplingParams
from splitspec.proposal import SequenceStep

CPU = torch.device("cpu")
GREEDY = SamplingParams(temperature=0.0)
SAMPLED = SamplingParams(temperature=0.8, top_p=0.95, seed=11)


@pytest.fixture(scope="module")
def draft_dir(noisy_draft_dir):
    return noisy_draft_dir


@pytest.fixture(scope="module")
def proposer(draft_dir):
    torch.set_num_threads(1)
    return DraftModelProposer.load(draft_dir, CPU, torch.float32, draft_top_k=16)


@pytest.fixture(scope="module")
def prompts(tiny_target_dir):
    tok = load_tokenizer(tiny_target_dir)
    texts = ["def add(a, b):\n    return a + b\n", "import os\nimport sys\n", "x = [1, 2, 3",
             "class Point:\n    def __init__(self, x, y):\n"]
    return [tok.encode(t, add_special_tokens=False) for t in texts]


@torch.inference_mode()
def reference_greedy(model, history: list[int], k: int) -> list[int]:
    """k greedy tokens by full recomputation (no cache): what the session must reproduce."""
    ids = list(history)
    for _ in range(k):
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
        ids.append(int(logits.argmax()))
    return ids[len(history):]


def test_greedy_drafts_follow_the_draft_model(proposer, prompts):
    session = proposer.open_session()
    for i, p in enumerate(prompts):
        (d,) = session.propose([SequenceStep(f"s{i}", p, len(p), 4, full_history=True)])
        assert not d.resync and d.q is None
        assert d.tokens == reference_greedy(proposer.model, p, 4)


@pytest.mark.parametrize("accepted", [0, 2, 4])
def test_delta_rolls_back_rejected_drafts_and_feeds_the_bonus_token(proposer, prompts,
                                                                    accepted):
    """After the verifier accepts `accepted` of 4 drafts and appends one more token, the next
    drafts are the draft model's greedy continuation of the new history, and the cached KV is
    exactly the history plus the k-1 drafts it fed. accepted == 4 is the bonus-token case: d4
    was drafted but never fed."""
    session = proposer.open_session()
    history = list(prompts[0])
    (d,) = session.propose([SequenceStep("s", history, len(history), 4, full_history=True)])
    assert session.cached_tokens("s") == history + d.tokens[:3]
    assert session.cached_kv_length("s") == len(history) + 3
    for _ in range(3):
        extra = (d.tokens[accepted] + 1) % proposer.vocab_size if accepted < 4 else 5
        new = d.tokens[:accepted] + [extra]
        history += new
        (d,) = session.propose([SequenceStep("s", new, len(history), 4)])
        assert not d.resync
        assert d.tokens == reference_greedy(proposer.model, history, 4)
        assert session.cached_tokens("s")[:len(history)] == history
        assert session.cached_kv_length("s") == len(history) + 3 == len(session.cached_tokens("s"))


def test_a_batch_mixing_new_rejected_and_bonus_rows_drafts_like_the_model(proposer, prompts):
    """Rows with different catch-ups share each step: a new short prompt (prefilled inside the
    batch), a new long one (prefilled alone), rows whose drafts were partly rejected (one token
    to feed) and rows with every draft accepted (two: d_k and the bonus token)."""
    session = proposer.open_session()
    histories = {"long": list(prompts[3]), "short": [11, 12, 13]}
    drafts = {sid: d for sid, d in zip(histories, session.propose(
        [SequenceStep(sid, h, len(h), 4, full_history=True) for sid, h in histories.items()]))}
    for rnd in range(4):
        steps = []
        for n, sid in enumerate(sorted(histories)):
            accepted = (rnd + n) % 5  # 0..4 of the 4 drafts
            d = drafts[sid].tokens
            new = d[:accepted] + [((d[accepted] + 1) % proposer.vocab_size) if accepted < 4 else 9]
            histories[sid] += new
            steps.append(SequenceStep(sid, new, len(histories[sid]), 4))
        joining = f"new{rnd}"
        histories[joining] = [20 + rnd, 21, 22, 23, 24][:2 + rnd]
        steps.append(SequenceStep(joining, histories[joining], 2 + rnd, 4, full_history=True))
        for d in session.propose(steps):
            h = histories[d.seq_id]
            assert d.tokens == reference_greedy(proposer.model, h, 4), (rnd, d.seq_id)
            assert session.cached_tokens(d.seq_id) == h + d.tokens[:3]
            assert session.cached_kv_length(d.seq_id) == len(h) + 3
            drafts[d.seq_id] = d


def test_batched_drafting_equals_one_sequence_at_a_time(proposer, prompts):
    steps = [SequenceStep(f"s{i}", p, len(p), k, full_history=True,
                          sampling=GREEDY if i % 2 else SamplingParams(temperature=0.8, seed=i))
             for i, (p, k) in enumerate(zip(prompts, [4, 1, 8, 3]))]
    batched = proposer.open_session().propose(steps)
    for step, b in zip(steps, batched):
        (single,) = proposer.open_session().propose([step])
        assert b.tokens == single.tokens and len(b.tokens) == step.k
        if step.sampling.greedy:
            assert b.q is None
        else:
            for qb, qs in zip(b.q.rows(), single.q.rows()):
                assert qb[0] == qs[0]
                assert qb[1] == pytest.approx(qs[1], abs=1e-5)


def test_sampled_drafts_send_the_truncated_q_they_were_drawn_from(proposer, prompts):
    p = prompts[1]
    step = SequenceStep("s", p, len(p), 4, full_history=True, sampling=SAMPLED)
    (d,) = proposer.open_session().propose([step])
    assert len(d.tokens) == 4 and d.q.num_rows == 4
    history = list(p)
    for tok, q in zip(d.tokens, d.q.rows()):
        assert 0 < len(q[0]) <= proposer.draft_top_k
        assert abs(sum(q[1]) - 1.0) < 1e-4 and min(q[1]) > 0
        assert tok in q[0]
        # q is apply_sampling_params of the draft's logits, top-K truncated and renormalised
        with torch.inference_mode():
            logits = proposer.model(input_ids=torch.tensor([history])).logits[0, -1:]
        full = apply_sampling_params(logits, torch.tensor([0.8]), torch.tensor([0]),
                                     torch.tensor([0.95]), torch.tensor([0.0]))[0]
        top = full.topk(proposer.draft_top_k)
        expected = {int(i): float(v) for i, v in zip(top.indices, top.values / top.values.sum())
                    if v > 0}
        assert set(q[0]) == set(expected)
        for i, prob in zip(q[0], q[1]):
            assert prob == pytest.approx(expected[i], abs=1e-4)
        history.append(tok)
    # seeded: the same tokens again, in a fresh session too
    (again,) = proposer.open_session().propose([step])
    assert again.tokens == d.tokens


@pytest.mark.parametrize("seeded", [False, True])
def test_choose_tokens_samples_in_proportion_to_the_truncated_q(seeded):
    # unseeded: the default RNG; seeded: keyed noise, one key per position, still distributed as q
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, -3.0]])
    counts = torch.zeros(5)
    n = 4000
    params = [SamplingParams(temperature=1.0, seed=5 if seeded else None)]
    torch.manual_seed(0)
    for pos in range(n):
        toks, dists = choose_tokens(logits, params, draft_keys(params, [pos]), top_k=3)
        counts[toks[0]] += 1
    q = torch.tensor(dists[0][1])
    assert dists[0][0] == [0, 1, 2] and counts[3:].sum() == 0
    assert torch.allclose(counts[:3] / n, q, atol=0.03)


def test_seeded_drafts_use_the_verifiers_keyed_noise():
    # the draft for position t of a seeded request is argmax(q / E(seed, t)) at q's token ids:
    # when q equals the target's p it is exactly the token the verifier will emit there
    from kernels.sampling import keyed_argmax, noise_key

    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(3))
    params = [SamplingParams(temperature=1.0, seed=11)]
    p = torch.softmax(logits, -1)
    for pos in range(20, 60):
        toks, _ = choose_tokens(logits, params, draft_keys(params, [pos]), top_k=50)
        assert toks[0] == int(keyed_argmax(p, [noise_key(11, pos)])[0])


def test_k_zero_records_and_unknown_or_inconsistent_sequences_resync(proposer, prompts):
    session = proposer.open_session()
    p = prompts[2]
    (d,) = session.propose([SequenceStep("s", p, len(p), 0, full_history=True)])
    assert d.tokens == [] and not d.resync
    (d,) = session.propose([SequenceStep("s", [7], len(p) + 1, 3)])
    assert d.tokens == reference_greedy(proposer.model, p + [7], 3)
    (d,) = session.propose([SequenceStep("s", [7], len(p) + 5, 3)])  # length disagrees
    assert d.resync and d.tokens == []
    (d,) = session.propose([SequenceStep("other", [1], 10, 3)])  # never heard of
    assert d.resync


def test_release_and_idle_eviction_drop_the_state(draft_dir, prompts, monkeypatch):
    clock = FakeClock()
    # the sessions' HistoryStore reads time.monotonic() of the module that defines it
    monkeypatch.setattr(sys.modules[HistoryStore.__module__], "time", clock)
    proposer = DraftModelProposer.load(draft_dir, CPU, torch.float32, idle_timeout_s=60.0)
    session = proposer.open_session()
    p = prompts[0]
    session.propose([SequenceStep("a", p, len(p), 2, full_history=True),
                     SequenceStep("b", p, len(p), 2, full_history=True)])
    session.release(["a"])
    assert session.cached_tokens("a") == []
    (d,) = session.propose([SequenceStep("a", [1], len(p) + 1, 2)])
    assert d.resync
    clock.advance(60.0)
    session.propose([SequenceStep("c", p, len(p), 1, full_history=True)])
    assert session.cached_tokens("b") != []  # idle for the timeout, not past it: kept
    clock.advance(0.5)
    session.propose([SequenceStep("c", [1], len(p) + 1, 1)])
    assert session.cached_tokens("b") == []  # idle past the timeout: evicted
    assert session.cached_tokens("c") != []
    (d,) = session.propose([SequenceStep("b", [1], len(p) + 1, 2)])
    assert d.resync


def test_info_reports_vocab_and_the_tokenizer_fingerprint(proposer, tiny_target_dir, tmp_path):
    from verifier_service.drafts.client import ProposerMismatch, check_compatible

    desc = proposer.describe()
    fp = tokenizer_fingerprint(load_tokenizer(tiny_target_dir))
    assert desc.method == "draft" and desc.vocab_size == 1024 and desc.tokenizer_fingerprint == fp
    assert not desc.needs_hidden_state
    check_compatible(desc, 1024, fp)
    with pytest.raises(ProposerMismatch, match="vocabulary size"):
        check_compatible(desc, 4096, fp)
    # an unrelated draft with the same tokenizer is compatible too (acceptance is its problem)
    other = DraftModelProposer.load(str(make_random_draft(tiny_target_dir, tmp_path / "r")),
                                    CPU, torch.float32)
    assert other.describe().tokenizer_fingerprint == fp


def test_the_server_builds_a_draft_proposer_from_its_flags(draft_dir):
    from proposer_service.config import ProposerConfig
    from proposer_service.server import build_proposer
    from splitspec.config import parse_config

    config = parse_config(ProposerConfig, ["--method", "draft", "--model", draft_dir,
                                           "--device", "cpu", "--dtype", "float32",
                                           "--draft-top-k", "8", "--max-batch", "4",
                                           "--max-num-speculative-tokens", "6"])
    built = build_proposer(config)
    assert isinstance(built, DraftModelProposer)
    assert (built.draft_top_k, built.max_batch, built.max_k) == (8, 4, 6)
    assert built.describe().max_num_speculative_tokens == 6
    assert next(built.model.parameters()).dtype == torch.float32
    with pytest.raises(SystemExit, match="needs --model"):
        build_proposer(parse_config(ProposerConfig, ["--method", "draft"]))
    with pytest.raises(SystemExit, match="cannot load"):
        build_proposer(parse_config(ProposerConfig, ["--method", "draft", "--model", "/nowhere"]))


def test_a_bfloat16_draft_sends_float32_distributions_that_sum_to_one(draft_dir, prompts):
    """--dtype is the proposer's own choice: q is computed in float32 whatever the weights."""
    low = DraftModelProposer.load(draft_dir, CPU, torch.bfloat16, draft_top_k=8)
    assert next(low.model.parameters()).dtype == torch.bfloat16
    steps = [SequenceStep("g", prompts[0], len(prompts[0]), 3, full_history=True),
             SequenceStep("s", prompts[1], len(prompts[1]), 3, full_history=True,
                          sampling=SAMPLED)]
    greedy, sampled = low.open_session().propose(steps)
    assert len(greedy.tokens) == 3 and greedy.q is None
    assert all(0 <= t < low.vocab_size for t in greedy.tokens + sampled.tokens)
    for tok, q in zip(sampled.tokens, sampled.q.rows()):
        assert tok in q[0] and abs(sum(q[1]) - 1) < 1e-4 and len(q[0]) <= 8
