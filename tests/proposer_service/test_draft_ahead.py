"""Drafting ahead in the draft-model proposer: drafting ahead for the likely outcomes of
a step, answering from it on a hit, and drafting afresh on a miss (never a stale draft)."""

from __future__ import annotations

import threading

import pytest
import torch
from test_draft_proposer import reference_greedy

from proposer_service.draft.proposer import DraftModelProposer
from splitspec.modelio import load_tokenizer
from splitspec.params import SamplingParams
from splitspec.proposal import AHEAD_HIT, AHEAD_MISS, SequenceStep

CPU = torch.device("cpu")
GREEDY = SamplingParams(temperature=0.0)
K = 4


@pytest.fixture(scope="module")
def proposer(noisy_draft_dir):
    torch.set_num_threads(1)
    return DraftModelProposer.load(noisy_draft_dir, CPU, torch.float32, draft_top_k=16)


@pytest.fixture(scope="module")
def prompt(tiny_target_dir):
    tok = load_tokenizer(tiny_target_dir)
    return tok.encode("def add(a, b):\n    return a + b\n", add_special_tokens=False)


def first_step(proposer, prompt, sampling=GREEDY):
    session = proposer.open_session()
    (d,) = session.propose([SequenceStep("s", list(prompt), len(prompt), K, full_history=True,
                                         sampling=sampling, draft_ahead=True)])
    assert session.has_ahead_work()
    return session, d


def outcome(session, history, delta, sampling=GREEDY):
    return SequenceStep("s", list(delta), len(history) + len(delta), K, sampling=sampling,
                        draft_ahead=True)


def test_all_accepted_outcome_hits_with_the_fresh_continuation(proposer, prompt):
    session, d = first_step(proposer, prompt)
    session.draft_ahead(threading.Event())
    bonus = reference_greedy(proposer.model, prompt + d.tokens, 1)[0]
    step = outcome(session, prompt, d.tokens + [bonus])
    assert session.ahead_may_hit([step])
    (hit,) = session.propose([step])
    history = prompt + d.tokens + [bonus]
    assert hit.ahead_outcome == AHEAD_HIT
    assert hit.tokens == reference_greedy(proposer.model, history, K)
    assert session.cached_tokens("s")[:len(history)] == history
    # the state taken over from the drafting ahead serves the next step like a fresh one
    nxt = hit.tokens[:1] + [(hit.tokens[1] + 1) % proposer.vocab_size]
    (again,) = session.propose([outcome(session, history, nxt)])
    assert again.tokens == reference_greedy(proposer.model, history + nxt, K)


def test_the_likeliest_rejection_outcomes_with_the_guessed_recovery_hit(proposer, prompt):
    """Rejections are drafted ahead for the outcomes the draft itself finds likeliest: accepted
    a prefix, then its best other token where it was rejected; each of them hits."""
    _, d = first_step(proposer, prompt)
    probe, _ = first_step(proposer, prompt)
    probe.draft_ahead(threading.Event())
    rejections = [o for o in probe._ready["s"].drafts if len(o) <= K]
    assert len(rejections) == proposer.ahead_rejections
    for delta in rejections:
        accepted = len(delta) - 1
        assert list(delta[:accepted]) == d.tokens[:accepted] and delta[-1] != d.tokens[accepted]
        # the guess is the draft model's best token other than its own draft there
        logits = proposer.model(input_ids=torch.tensor([prompt + d.tokens[:accepted]])).logits
        top = logits[0, -1].topk(2).indices.tolist()
        assert delta[-1] == next(t for t in top if t != d.tokens[accepted])
        session, _ = first_step(proposer, prompt)
        session.draft_ahead(threading.Event())
        (hit,) = session.propose([outcome(session, prompt, list(delta))])
        assert hit.ahead_outcome == AHEAD_HIT
        assert hit.tokens == reference_greedy(proposer.model, prompt + list(delta), K)


def test_an_outcome_not_drafted_ahead_is_a_miss_drafted_afresh(proposer, prompt):
    check_a_miss_is_drafted_afresh(proposer, prompt)


def check_a_miss_is_drafted_afresh(proposer, prompt) -> None:
    """The guarding check of tests/proposer_service/test_draft_ahead_controls.py."""
    session, d = first_step(proposer, prompt)
    session.draft_ahead(threading.Event())
    ready = {tuple(t) for t in session._ready["s"].drafts}
    unlikely = next(t for t in range(proposer.vocab_size) if (t,) not in ready)
    step = outcome(session, prompt, [unlikely])
    assert not session.ahead_may_hit([step])
    (miss,) = session.propose([step])
    assert miss.ahead_outcome == AHEAD_MISS
    # never a stale draft: exactly the fresh continuation of the actual history
    assert miss.tokens == reference_greedy(proposer.model, prompt + [unlikely], K)


def test_cancelled_drafting_ahead_keeps_nothing_and_counts_a_miss(proposer, prompt):
    session, d = first_step(proposer, prompt)
    cancel = threading.Event()
    cancel.set()
    session.draft_ahead(cancel)
    assert session._ready["s"].drafts == {}
    bonus = reference_greedy(proposer.model, prompt + d.tokens, 1)[0]
    (miss,) = session.propose([outcome(session, prompt, d.tokens + [bonus])])
    assert miss.ahead_outcome == AHEAD_MISS
    assert miss.tokens == reference_greedy(proposer.model, prompt + d.tokens + [bonus], K)


def test_without_draft_ahead_nothing_is_drafted_ahead(proposer, prompt):
    session = proposer.open_session()
    (d,) = session.propose([SequenceStep("s", list(prompt), len(prompt), K, full_history=True)])
    assert not session.has_ahead_work()
    (d2,) = session.propose([SequenceStep("s", d.tokens[:1] + [3], len(prompt) + 2, K)])
    assert d2.ahead_outcome == ""


def test_a_seeded_sampled_hit_equals_the_fresh_draft_and_carries_its_q(proposer, prompt):
    """Keyed randomness: a draft depends on (seed, position) only, so the draft ahead for an
    outcome is the very draft a fresh session drafts for that history, with the same q."""
    sampled = SamplingParams(temperature=0.8, seed=5)
    session, d = first_step(proposer, prompt, sampled)
    session.draft_ahead(threading.Event())
    delta = next(iter(session._ready["s"].drafts))
    (hit,) = session.propose([outcome(session, prompt, delta, sampled)])
    assert hit.ahead_outcome == AHEAD_HIT and hit.q is not None
    history = prompt + list(delta)
    fresh_session = proposer.open_session()
    (fresh,) = fresh_session.propose([SequenceStep("s", history, len(history), K,
                                                   full_history=True, sampling=sampled)])
    assert hit.tokens == fresh.tokens
    assert torch.equal(hit.q.indices, fresh.q.indices)
    assert torch.allclose(hit.q.probs, fresh.q.probs, atol=1e-5)
    assert bool((hit.q.prob_of(torch.tensor(hit.tokens)) > 0).all())


def test_an_unseeded_sampled_all_accepted_guess_is_the_mode_and_its_hit_carries_q(proposer,
                                                                                   prompt):
    sampled = SamplingParams(temperature=0.8)
    session, d = first_step(proposer, prompt, sampled)
    session.draft_ahead(threading.Event())
    (delta,) = [o for o in session._ready["s"].drafts if len(o) == K + 1]
    assert list(delta[:K]) == d.tokens
    mode = reference_greedy(proposer.model, prompt + d.tokens, 1)[0]
    assert delta[K] == mode  # the likeliest bonus token, not a sample
    (hit,) = session.propose([outcome(session, prompt, delta, sampled)])
    assert hit.ahead_outcome == AHEAD_HIT and len(hit.tokens) == K and hit.q is not None
    assert bool((hit.q.prob_of(torch.tensor(hit.tokens)) > 0).all())


def test_after_a_tree_a_taken_leaf_and_the_kept_chain_hit(proposer, prompt):
    """A tree step (max_branch 2) sends the chain with leaves; drafting ahead follows that tree:
    the chain as far as it was kept, all accepted, and each leaf accepted with a bonus token
    after it. Both outcomes are answered from the drafting ahead, with the fresh continuation."""
    from proposer_service.draft.session import _spine_and_leaves

    def tree_step(session):
        (tree,) = session.propose([SequenceStep("s", list(prompt), len(prompt), 6,
                                                full_history=True, draft_ahead=True,
                                                max_branch=2)])
        assert not tree.is_chain and session.has_ahead_work()
        session.draft_ahead(threading.Event())
        return tree

    session = proposer.open_session()
    spine, leaves = _spine_and_leaves(tree_step(session))
    assert leaves and len(spine) < 6  # the budget went partly to leaves
    bonus = reference_greedy(proposer.model, prompt + spine, 1)[0]
    delta = spine + [bonus]
    step = SequenceStep("s", delta, len(prompt) + len(delta), 6, draft_ahead=True, max_branch=2)
    assert session.ahead_may_hit([step])
    (hit,) = session.propose([step])
    assert hit.ahead_outcome == AHEAD_HIT
    assert hit.tokens == reference_greedy(proposer.model, prompt + delta, len(hit.tokens))
    session = proposer.open_session()
    tree_step(session)
    # the leaves among the outcomes drafted ahead (the likeliest ones, ahead_rejections of them)
    taken = [o for o in session._ready["s"].drafts if o[:-1] in leaves]
    assert taken
    leaf = taken[0][:-1]
    delta = list(leaf) + reference_greedy(proposer.model, prompt + list(leaf), 1)
    step = SequenceStep("s", delta, len(prompt) + len(delta), 6, draft_ahead=True, max_branch=2)
    assert session.ahead_may_hit([step])
    (hit,) = session.propose([step])
    assert hit.ahead_outcome == AHEAD_HIT
    assert hit.tokens == reference_greedy(proposer.model, prompt + delta, len(hit.tokens))
