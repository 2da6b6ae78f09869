"""The draft's resident cache (proposer_service/draft/slots.py): a proposer whose sequences own
slots drafts exactly what the per-sequence path drafts, eagerly and through the captured loop's
iterations (graphs.py), over random runs of steps (accepted prefixes, rejections, bonus tokens,
drafting ahead on and off, sequences joining and leaving, more sequences than slots); a slot
goes back to the free list when its sequence ends, and prefix reuse survives its slot's reuse."""

from __future__ import annotations

import random
import threading

import pytest
import torch

from proposer_service.draft.graphs import DraftGraphs, scratch_rows
from proposer_service.draft.proposer import DraftModelProposer
from proposer_service.draft.slots import DraftSlots
from splitspec.params import SamplingParams
from splitspec.proposal import AHEAD_HIT, SequenceStep

CPU = torch.device("cpu")
K = 4


@pytest.fixture(scope="module")
def pair(noisy_draft_dir):
    """The per-sequence path (no slots) and a resident cache of 3 slots."""
    torch.set_num_threads(1)
    old = DraftModelProposer.load(noisy_draft_dir, CPU, torch.float32, draft_top_k=16,
                                  cache_slots=0, prefix_cache_mb=0)
    new = DraftModelProposer.load(noisy_draft_dir, CPU, torch.float32, draft_top_k=16,
                                  cache_slots=3, prefix_cache_mb=0)
    assert old.slots is None and new.slots.slots == 3
    return old, new


def run_steps(pair, seed: int, sampling: SamplingParams, ahead: bool, steps: int = 10,
              max_live: int = 5) -> tuple[int, int]:
    """Drive both proposers' sessions with the same random run of steps and assert every
    draft is the same; returns the slots used at the busiest step and the drafts answered
    from drafting ahead."""
    rng = random.Random(seed)
    old_p, new_p = pair
    sessions = [old_p.open_session(), new_p.open_session()]
    vocab = old_p.vocab_size
    live: dict[str, tuple[list[int], list[int]]] = {}  # sid -> (history, last draft)
    busiest, next_id, hits = 0, 0, 0
    for _ in range(steps):
        # join and leave
        if len(live) < max_live and rng.random() < 0.6:
            sid = f"s{next_id}"
            next_id += 1
            live[sid] = ([rng.randrange(vocab) for _ in range(rng.randint(3, 30))], [])
        if live and rng.random() < 0.2:
            gone = rng.choice(sorted(live))
            del live[gone]
            for s in sessions:
                s.release([gone])
        work = []
        for sid, (history, draft) in sorted(live.items()):
            if not draft:  # first step of the sequence
                work.append(SequenceStep(sid, list(history), len(history), K, full_history=True,
                                         sampling=sampling, draft_ahead=ahead))
                continue
            ready = sessions[0]._ready.get(sid)
            if ready is not None and ready.drafts and rng.random() < 0.5:
                delta = list(rng.choice(sorted(ready.drafts)))  # an outcome drafted ahead
            else:
                n = rng.randint(0, len(draft))
                delta = draft[:n] + [rng.randrange(vocab)]
            history.extend(delta)
            work.append(SequenceStep(sid, delta, len(history), K, sampling=sampling,
                                     draft_ahead=ahead))
        if not work:
            continue
        out = [s.propose(list(work)) for s in sessions]
        for a, b in zip(*out):
            assert a.tokens == b.tokens, (a.seq_id, a.tokens, b.tokens)
            assert a.ahead_outcome == b.ahead_outcome
            hits += a.ahead_outcome == AHEAD_HIT
            assert (a.q is None) == (b.q is None)
            if a.q is not None:
                for ra, rb in zip(a.q.rows(), b.q.rows()):
                    assert ra[0] == rb[0]
                    torch.testing.assert_close(torch.tensor(ra[1]), torch.tensor(rb[1]))
            live[a.seq_id] = (live[a.seq_id][0], list(a.tokens))
        for sid in live:
            assert sessions[0].cached_tokens(sid) == sessions[1].cached_tokens(sid)
        busiest = max(busiest, new_p.slots.slots - new_p.slots.free_slots())
        for s in sessions:
            if s.has_ahead_work():
                s.draft_ahead(threading.Event())
    for s in sessions:
        s.close()
    assert new_p.slots.free_slots() == new_p.slots.slots  # every slot back
    return busiest, hits


def check_greedy_runs(pair, ahead: bool) -> None:
    runs = [run_steps(pair, seed, SamplingParams(temperature=0.0), ahead) for seed in range(3)]
    # more sequences than slots: some drafted on the per-sequence path
    assert max(busiest for busiest, _ in runs) == 3
    assert (sum(hits for _, hits in runs) > 0) == ahead  # drafted-ahead states took slots over


@pytest.mark.parametrize("ahead", [False, True])
def test_greedy_drafts_over_slots_equal_the_per_sequence_path(pair, ahead):
    check_greedy_runs(pair, ahead)


@pytest.mark.parametrize("ahead", [False, True])
def test_seeded_sampled_drafts_over_slots_equal_the_per_sequence_path(pair, ahead):
    run_steps(pair, 7, SamplingParams(temperature=0.9, top_k=50, seed=1234), ahead)


def test_a_rollback_reuses_the_slot_and_a_finished_sequence_frees_it(pair):
    _, new = pair
    session = new.open_session()
    free = new.slots.free_slots()
    prompt = list(range(5, 25))
    (d,) = session.propose([SequenceStep("a", prompt, len(prompt), K, full_history=True,
                                         sampling=SamplingParams(temperature=0.0))])
    state = session._states["a"]
    slot = state.slot
    assert slot is not None and new.slots.free_slots() == free - 1
    assert state.length() == len(prompt) + K - 1  # the prompt and d1 .. d_{k-1}
    # rejected at the first draft: the state keeps only the history, in the same slot
    step = SequenceStep("a", [(d.tokens[0] + 1) % new.vocab_size], len(prompt) + 1, K,
                        sampling=SamplingParams(temperature=0.0))
    session.propose([step])
    assert state.slot == slot and state.length() == len(prompt) + 1 + K - 1
    session.release(["a"])
    assert state.slot is None and new.slots.free_slots() == free


@pytest.fixture(scope="module")
def graph_pair(pair, noisy_draft_dir):
    """The per-sequence path, and a proposer whose steps run the captured loop's iterations
    (eagerly: the CPU has no graphs) over 3 slots and its scratch rows."""
    new = DraftModelProposer.load(noisy_draft_dir, CPU, torch.float32, draft_top_k=16,
                                  cache_slots=0, prefix_cache_mb=0)
    capacity = new.max_positions
    new.slots = DraftSlots(new.lean, CPU, 3, capacity, scratch_rows(new.max_batch))
    new.graphs = DraftGraphs(new.lean, CPU, capacity, new.max_batch, new.max_k, capture=False,
                             widths=tuple(range(1, 10)), top_k=16, slots=new.slots)
    new.graphs._graphs = {"none": None}  # "captured": every shape runs its iteration eagerly
    return pair[0], new


@pytest.mark.parametrize("ahead", [False, True])
def test_the_captured_loop_over_slots_drafts_what_the_per_sequence_path_drafts(graph_pair,
                                                                               ahead):
    check_greedy_runs(graph_pair, ahead)
    run_steps(graph_pair, 11, SamplingParams(temperature=0.9, top_k=50, seed=99), ahead)
    assert not graph_pair[1].fallbacks.counts  # every step went through the loop


@pytest.fixture(scope="module")
def prefixed_pair(noisy_draft_dir):
    """As `pair`, with prefix reuse on and 2 slots."""
    return tuple(DraftModelProposer.load(noisy_draft_dir, CPU, torch.float32, draft_top_k=16,
                                         cache_slots=slots, prefix_cache_mb=16)
                 for slots in (0, 2))


def check_prefix_reuse_after_the_slot_is_reused(prefixed_pair) -> None:
    """A finishes; B takes A's slot over and writes its own columns; C starts the way A did and
    seeds from A's kept cache: every draft as on the per-sequence path."""
    old_p, new_p = prefixed_pair
    greedy = SamplingParams(temperature=0.0)
    rng = random.Random(3)
    a = [rng.randrange(old_p.vocab_size) for _ in range(40)]
    b = [rng.randrange(old_p.vocab_size) for _ in range(40)]
    c = a[:36] + [rng.randrange(old_p.vocab_size) for _ in range(6)]
    sessions = [p.open_session() for p in prefixed_pair]
    hits = new_p.prefixes.hits
    for sid, prompt in (("a", a), ("b", b), ("c", c)):
        out = [s.propose([SequenceStep(sid, prompt, len(prompt), K, full_history=True,
                                       sampling=greedy)]) for s in sessions]
        assert out[0][0].tokens == out[1][0].tokens, sid
        if sid == "a":
            for s in sessions:
                s.release(["a"])
    assert new_p.prefixes.hits > hits  # C started from A's kept cache
    for s in sessions:
        s.close()


def test_prefix_reuse_survives_the_slot_being_reused(prefixed_pair):
    check_prefix_reuse_after_the_slot_is_reused(prefixed_pair)


class _Recorded:
    """A stand-in for a captured graph on the CPU: its replay runs the iterations it records."""

    def __init__(self, graphs: DraftGraphs, shape: tuple):
        self.graphs, self.shape, self.replays = graphs, shape, 0

    def replay(self) -> None:
        self.replays += 1
        self.graphs._body(self.shape)


def test_a_step_whose_k_has_a_chain_replays_it_once_and_drafts_the_same(graph_pair):
    """--draft-graph-chain-k: a step with that k replays the whole loop's graph once (the
    iterations it recorded), drafting what k replays of the one-iteration graphs draft."""
    old, new = graph_pair
    graphs = new.graphs
    chain = _Recorded(graphs, (1, 1, False, K))
    saved = graphs._graphs
    graphs._graphs = {**saved, (1, 1, False, K): chain}
    try:
        sessions = [old.open_session(), new.open_session()]
        prompt = list(range(7, 40))
        step = SequenceStep("c", prompt, len(prompt), K, full_history=True,
                            sampling=SamplingParams(temperature=0.0))
        first = [s.propose([step])[0] for s in sessions]  # the prompt prefilled, width 1
        nxt = SequenceStep("c", first[0].tokens[:2] + [5], len(prompt) + 3, K,
                           sampling=SamplingParams(temperature=0.0))
        second = [s.propose([nxt])[0] for s in sessions]
        assert first[0].tokens == first[1].tokens and second[0].tokens == second[1].tokens
        assert chain.replays == 2
        for s in sessions:
            s.close()
    finally:
        graphs._graphs = saved


def test_sequences_that_outgrow_their_slot_draft_on_unchanged(pair, noisy_draft_dir):
    """Slots of 48 columns: sequences grow past them and go on with their own tensors (their
    slot freed for others), drafting what the per-sequence path drafts."""
    new = DraftModelProposer.load(noisy_draft_dir, CPU, torch.float32, draft_top_k=16,
                                  cache_slots=0, prefix_cache_mb=0)
    new.slots = DraftSlots(new.lean, CPU, 3, 48)
    outgrown = []
    unbind = new.unbind

    def watch(state, keep_cache=False):
        if keep_cache and state is not None and state.slot is not None:
            outgrown.append(state.length())
        unbind(state, keep_cache)

    new.unbind = watch
    for ahead in (False, True):
        run_steps((pair[0], new), 5, SamplingParams(temperature=0.0), ahead, steps=14)
    assert outgrown  # some sequence did outgrow its slot
