"""The MLP speculator proposer's session: drafts from the step's hidden state, capped at the
speculator's heads, batched, sampled with a sparse q, resync/release, and what Info reports."""

from __future__ import annotations

import hashlib
import json
import sys

import planted_bugs as bug
import pytest
import torch
from capture_rules import GraphSafe
from clocks import FakeClock
from tiny_proposer_models import TINY_TARGET, make_mlp_speculator

from proposer_service.base import HistoryStore
from proposer_service.mlp.proposer import MlpSpeculatorProposer
from proposer_service.mlp.speculator import MLPSpeculator
from proposer_service.tree_builder import reindex, select
from splitspec.modelio import load_tokenizer, tokenizer_fingerprint
from splitspec.params import SamplingParams
from splitspec.proposal import SequenceStep, step_from_pb, step_to_pb

CPU = torch.device("cpu")
HIDDEN = 64  # tests/fixtures/tiny-llama's hidden size

@pytest.fixture(scope="session")
def tiny_target_dir() -> str:
    return TINY_TARGET



@pytest.fixture(scope="module")
def spec_dir(tiny_target_dir, tmp_path_factory):
    return str(make_mlp_speculator(tiny_target_dir, tmp_path_factory.mktemp("mlp"), n_predict=4))


@pytest.fixture(scope="module")
def proposer(spec_dir):
    torch.set_num_threads(1)
    return MlpSpeculatorProposer.load(spec_dir, CPU, torch.float32, draft_top_k=16)


def hidden(seed: int) -> torch.Tensor:
    return torch.randn(HIDDEN, generator=torch.Generator().manual_seed(seed))  # [H] float32


def step(sid, tokens, k, seed=0, full=True, history_len=None, **kw):
    return SequenceStep(sid, tokens, history_len or len(tokens), k, full_history=full,
                        hidden_state=hidden(seed), **kw)


def test_greedy_drafts_are_the_speculators_suggestions(proposer):
    session = proposer.open_session()
    (d,) = session.propose([step("s", [5, 6, 7], 4)])
    ref = proposer.model.generate_suggestions(hidden(0)[None], torch.tensor([7]), 4)[0].tolist()
    assert d.tokens == ref and d.q is None and not d.resync
    # next step: a delta, and the last token of the new history is what head 0 conditions on
    (d,) = session.propose([step("s", [9, 10], 4, seed=1, full=False, history_len=5)])
    ref = proposer.model.generate_suggestions(hidden(1)[None], torch.tensor([10]), 4)[0].tolist()
    assert d.tokens == ref


def test_k_is_capped_at_the_trained_heads_and_a_missing_state_drafts_nothing(proposer):
    session = proposer.open_session()
    (d,) = session.propose([step("s", [1, 2], 8)])
    assert len(d.tokens) == 4 and proposer.describe().max_num_speculative_tokens == 4
    no_state = SequenceStep("t", [1, 2], 2, 4, full_history=True)
    wrong = SequenceStep("u", [1, 2], 2, 4, full_history=True, hidden_state=torch.zeros(7))
    for d in session.propose([no_state, wrong]):
        assert d.tokens == [] and not d.resync


def test_batched_equals_single_and_mixes_greedy_with_sampled(proposer):
    steps = [step(f"s{i}", [3 + i, 4 + i], k, seed=i,
                  sampling=SamplingParams(temperature=0.0 if i % 2 else 0.8, top_p=0.95, seed=i))
             for i, k in enumerate([4, 1, 3, 2])]
    batched = proposer.open_session().propose(steps)
    for s, b in zip(steps, batched):
        (single,) = proposer.open_session().propose([s])
        assert b.tokens == single.tokens and len(b.tokens) == s.k
        assert (b.q is None) == s.sampling.greedy
        if b.q is not None:
            for qb, qs, tok in zip(b.q.rows(), single.q.rows(), b.tokens):
                assert qb[0] == qs[0] and tok in qb[0]
                assert abs(sum(qb[1]) - 1) < 1e-4 and len(qb[0]) <= 16
                assert qb[1] == pytest.approx(qs[1], abs=1e-5)


def test_the_hidden_state_survives_the_wire_in_fp16_and_fp32(proposer):
    for dtype in (torch.float32, torch.float16):
        s = step("s", [1, 2, 3], 3)
        s.hidden_state = s.hidden_state.to(dtype)
        back = step_from_pb(step_to_pb(s))
        assert back.hidden_state.dtype == dtype and back.hidden_state.shape == (HIDDEN,)
        (d,) = proposer.open_session().propose([back])
        assert len(d.tokens) == 3


def test_resync_release_and_idle_eviction(spec_dir, monkeypatch):
    clock = FakeClock()
    # the sessions' HistoryStore reads time.monotonic() of the module that defines it
    monkeypatch.setattr(sys.modules[HistoryStore.__module__], "time", clock)
    proposer = MlpSpeculatorProposer.load(spec_dir, CPU, torch.float32, idle_timeout_s=60.0)
    session = proposer.open_session()
    (d,) = session.propose([step("a", [1], 2, full=False, history_len=2)])
    assert d.resync
    session.propose([step("a", [1, 2], 2), step("b", [1, 2], 2)])
    session.release(["a"])
    assert "a" not in session and "b" in session
    clock.advance(60.5)
    session.propose([step("c", [1], 1)])
    assert "b" not in session and "c" in session


def test_info_needs_the_hidden_state_and_names_the_targets_vocabulary(proposer, spec_dir,
                                                                      tiny_target_dir,
                                                                      tmp_path):
    desc = proposer.describe()
    fp = tokenizer_fingerprint(load_tokenizer(tiny_target_dir))
    assert desc.method == "mlp" and desc.needs_hidden_state
    assert desc.vocab_size == 1024 and desc.tokenizer_fingerprint == fp
    # the recorded fingerprint (sha256 over the sorted (token, id) pairs) is checked at load
    # time: the matching one loads, a different one is refused
    spec = MLPSpeculator.from_pretrained(spec_dir, dtype=torch.float32)
    items = sorted(load_tokenizer(tiny_target_dir).get_vocab().items(), key=lambda kv: kv[1])
    spec.config.target_vocab_fingerprint = hashlib.sha256(
        json.dumps(items, ensure_ascii=False).encode()).hexdigest()
    spec.save_pretrained(tmp_path / "good")
    MlpSpeculatorProposer.load(str(tmp_path / "good"), CPU, torch.float32)
    spec.config.target_vocab_fingerprint = "0" * 64
    spec.save_pretrained(tmp_path / "bad")
    with pytest.raises(ValueError, match="different vocabulary"):
        MlpSpeculatorProposer.load(str(tmp_path / "bad"), CPU, torch.float32)


def test_the_tokenizer_is_found_from_the_speculators_config_or_flag(spec_dir, tiny_target_dir,
                                                                    tmp_path):
    from proposer_service.config import ProposerConfig
    from proposer_service.server import build_proposer
    from splitspec.config import parse_config

    # recorded as an absolute path by the fixture; with --tokenizer given explicitly too
    for extra in ([], ["--tokenizer", tiny_target_dir]):
        built = build_proposer(parse_config(ProposerConfig, [
            "--method", "mlp", "--model", spec_dir, "--device", "cpu", "--dtype", "float32",
            *extra]))
        assert isinstance(built, MlpSpeculatorProposer) and built.describe().needs_hidden_state
    # a recorded target that cannot be found is an error naming the flag
    spec = MLPSpeculator.from_pretrained(spec_dir, dtype=torch.float32)
    spec.config.target_model = "no/such/target"
    spec.save_pretrained(tmp_path / "lost")
    with pytest.raises(SystemExit, match="--tokenizer"):
        build_proposer(parse_config(ProposerConfig, ["--method", "mlp", "--model",
                                                     str(tmp_path / "lost")]))


@torch.no_grad()
def brute_force_tree(model, h, last, k, branch, depth):
    """Every top-`branch` expansion up to `depth`, each node's log-probability from a direct
    teacher-forced forward of its own path, then the shared best-first cut to k nodes."""
    tokens, parents, scores = [], [], []
    level = [(-1, [], 0.0)]  # (node, its path of tokens, cumulative log-probability)
    for d in range(depth):
        nxt = []
        for node, path, score in level:
            conditioning = torch.tensor([[[last, *path]]])  # [1, 1, d + 1]
            logp = model(h[None, None], conditioning)[d, 0, 0].float().log_softmax(-1)  # [V]
            lp, ids = logp.topk(branch)
            for t, lt in zip(ids.tolist(), lp.tolist()):
                tokens.append(t)
                parents.append(node)
                scores.append(score + lt)
                nxt.append((len(tokens) - 1, [*path, t], score + lt))
        level = nxt
    return reindex(tokens, parents, select(parents, scores, k, branch))


def test_a_tree_step_is_the_best_first_top_k_tree_of_a_direct_forward(proposer):
    model = proposer.model
    for seed, (k, branch) in enumerate([(4, 2), (3, 3), (3, 2), (2, 2), (1, 4)]):
        s = step("s", [5, 6, 7 + seed], k, seed=seed, max_branch=branch)
        (d,) = proposer.open_session().propose([s])
        # no node deeper than the budget can be kept: expanding to depth k is the whole tree
        assert (d.tokens, d.parents) == brute_force_tree(model, hidden(seed), 7 + seed, k,
                                                         branch, depth=k)
        assert len(d.tokens) == k and d.q is None
        # every node's token is among its head's top-`branch` given its ancestors
        for i, p in enumerate(d.parents):
            path = []
            while p >= 0:
                path.insert(0, d.tokens[p])
                p = d.parents[p]
            with torch.no_grad():
                logits = model(hidden(seed)[None, None], torch.tensor([[[7 + seed, *path]]]))
            assert d.tokens[i] in logits[len(path), 0, 0].topk(branch).indices.tolist()


def test_one_token_per_head_is_the_chain_and_sampled_trees_are_deterministic(proposer):
    model = proposer.model
    for seed in range(3):
        chain = model.generate_suggestions(hidden(seed)[None], torch.tensor([9]), 4)[0].tolist()
        ((tokens, parents),) = model.generate_tree(hidden(seed)[None], torch.tensor([9]), [4], [1])
        assert tokens == chain and parents == [-1, 0, 1, 2]
        (d,) = proposer.open_session().propose([step("s", [8, 9], 4, seed=seed, max_branch=1)])
        assert d.tokens == chain and d.parents == [-1, 0, 1, 2]
    sampled = SamplingParams(temperature=0.8, top_p=0.9, seed=3)
    (greedy,) = proposer.open_session().propose([step("g", [8, 9], 4, max_branch=2)])
    (drawn,) = proposer.open_session().propose([step("g", [8, 9], 4, max_branch=2,
                                                     sampling=sampled)])
    assert (drawn.tokens, drawn.parents, drawn.q) == (greedy.tokens, greedy.parents, None)


def test_batched_trees_equal_single_ones_beside_chains(proposer):
    steps = [step(f"s{i}", [3 + i, 4 + i], k, seed=i, max_branch=b)
             for i, (k, b) in enumerate([(4, 2), (2, 1), (3, 3), (4, 4), (1, 2)])]
    batched = proposer.open_session().propose(steps)
    for s, b in zip(steps, batched):
        (single,) = proposer.open_session().propose([s])
        assert (b.tokens, b.parents) == (single.tokens, single.parents) and len(b.tokens) == s.k


def test_the_replayed_greedy_heads_draft_what_the_loop_drafts(proposer):
    """The path a captured graph serves (all heads greedily, rows padded to the bucket), here
    run eagerly: per row the same first k tokens as the drafting loop."""
    work = [(step(f"s{i}", [5, 6, 7 + i], k, seed=i), 7 + i, hidden(i))
            for i, k in enumerate((4, 2, 3))]
    loop = proposer.draft_batch(work)
    replayed = proposer._replayed(work, [4, 2, 3], 4, torch.float32)
    assert [d.tokens for d in replayed] == [d.tokens for d in loop]


def test_the_captured_heads_copy_nothing_in_and_read_nothing_back(proposer):
    """What the greedy and the sampled graphs record, run under the capture rules."""
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, seed=4),
              SamplingParams(temperature=1.0, top_k=12)]
    work = [(step(f"s{i}", [5, 6, 7 + i], 4, sampling=p), 7 + i, hidden(i))
            for i, p in enumerate(params)]
    values = proposer._sampled_values(work, 4, torch.float32)
    with torch.inference_mode(), GraphSafe():
        proposer._greedy_heads({"hidden": values["hidden"], "token": values["token"]})
        proposer._sampled_heads(values)


def check_replayed_sampled_heads_match(proposer) -> None:
    """The path a captured sampled graph serves, here run eagerly: greedy and seeded rows draft
    the loop's very tokens; every sampled row sends the loop's very q (an unseeded row's at its
    first head; its later ones follow its own draws), and each token lies in its q."""
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, seed=4),
              SamplingParams(temperature=1.0, top_k=12), SamplingParams(temperature=0.6,
                                                                       top_p=0.9, seed=7)]
    work = [(step(f"s{i}", [5, 6, 7 + i], 4, seed=i, sampling=p), 7 + i, hidden(i))
            for i, p in enumerate(params)]
    loop = proposer.draft_batch(work)
    replayed = proposer._replayed_sampled(work, [4] * 4, 4, torch.float32)
    assert replayed[0].q is None and replayed[0].tokens == loop[0].tokens
    for i, heads in ((1, 4), (2, 1), (3, 4)):
        if heads == 4:
            assert replayed[i].tokens == loop[i].tokens, i
        for (got_ids, got_p), (want_ids, want_p) in list(
                zip(replayed[i].q.rows(), loop[i].q.rows()))[:heads]:
            assert list(got_ids) == list(want_ids)
            assert list(got_p) == pytest.approx(list(want_p), abs=1e-6)
        for token, (ids, probs) in zip(replayed[i].tokens, replayed[i].q.rows()):
            assert token in list(ids) and sum(probs) == pytest.approx(1.0, abs=1e-5)


def test_the_replayed_sampled_heads_draft_what_the_loop_drafts(proposer):
    check_replayed_sampled_heads_match(proposer)


def test_replayed_heads_blind_to_seeds_fail_the_comparison(proposer, monkeypatch):
    bug.static_draft_choice_ignores_seeds(monkeypatch)
    with pytest.raises(AssertionError):
        check_replayed_sampled_heads_match(proposer)


def test_batches_no_graph_serves_are_counted_as_eager_on_a_device_that_captures(proposer,
                                                                                 monkeypatch):
    from splitspec.graphs import EagerFallbacks

    monkeypatch.setattr(proposer, "fallbacks", EagerFallbacks("the MLP speculator's heads"))
    proposer.draft_batch([(step("a", [5, 6, 7], 3), 7, hidden(0))])
    assert not proposer.fallbacks.counts  # a CPU captures nothing: nothing fell back
    monkeypatch.setattr(proposer.replay, "enabled", True)  # as on a device, none captured
    proposer.draft_batch([(step("a", [5, 6, 7], 3), 7, hidden(0))])
    proposer.draft_tree_batch([(step("b", [5, 6, 7], 3, max_branch=2), 7, hidden(1))])
    assert proposer.fallbacks.counts == {"not_captured": 1, "tree": 1}
