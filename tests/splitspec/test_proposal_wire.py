import torch

from kernels.sparse_probs import SparseProbs
from splitspec.params import SamplingParams
from splitspec.proposal import (
    AHEAD_PUSHED,
    AheadDraft,
    Draft,
    SequenceStep,
    ahead_from_pb,
    ahead_to_pb,
    draft_from_pb,
    draft_to_pb,
    step_from_pb,
    step_to_pb,
    tensor_from_pb,
    tensor_to_pb,
)


def test_tensor_round_trip_is_exact_for_each_dtype():
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        t = torch.randn(3, 5).to(dtype)
        msg = tensor_to_pb(t)
        assert len(msg.data) == t.numel() * t.element_size()
        back = tensor_from_pb(msg)
        assert back.dtype == dtype and torch.equal(back, t)


def test_step_and_draft_round_trip():
    step = SequenceStep("s1", [1, 2, 3], 10, 4, full_history=True,
                        sampling=SamplingParams(temperature=0.8, top_p=0.9, seed=7),
                        hidden_state=torch.ones(8))
    back = step_from_pb(step_to_pb(step))
    assert (back.seq_id, back.new_tokens, back.history_len, back.k, back.full_history) == \
        ("s1", [1, 2, 3], 10, 4, True)
    assert back.sampling == step.sampling and torch.equal(back.hidden_state, step.hidden_state)

    d = Draft("s1", [5, 6], SparseProbs.from_rows([([5, 9], [0.75, 0.25]), ([6], [1.0])]))
    back = draft_from_pb(draft_to_pb(d))
    assert (back.seq_id, back.tokens, back.resync) == ("s1", [5, 6], False)
    assert back.q.rows() == [([5, 9], [0.75, 0.25]), ([6], [1.0])]
    assert torch.equal(back.q.indices, d.q.indices) and torch.equal(back.q.probs, d.q.probs)
    assert draft_from_pb(draft_to_pb(Draft("s3", [4]))).q is None
    assert draft_from_pb(draft_to_pb(Draft("s2", resync=True))).resync


def test_a_pushed_draft_round_trips_and_serves_only_its_own_step():
    q = SparseProbs.from_rows([([5, 6], [0.75, 0.25]), ([7], [1.0]), ([8, 9], [0.5, 0.5])])
    a = AheadDraft(12, (3, 4), Draft("s1", [5, 7, 8], q))
    back = ahead_from_pb(ahead_to_pb(a))
    assert (back.history_len, back.outcome, back.draft.seq_id) == (12, (3, 4), "s1")
    assert back.draft.tokens == [5, 7, 8] and back.draft.q.rows() == q.rows()

    def step(new, hist, k, full=False):
        return SequenceStep("s1", new, hist, k, full_history=full, draft_ahead=True)

    assert a.serves(step([3, 4], 12, 3)) and a.serves(step([3, 4], 12, 2))
    assert not a.serves(step([3, 5], 12, 3))  # another outcome
    assert not a.serves(step([3, 4], 13, 3))  # another history (a stale push)
    assert not a.serves(step([3, 4], 12, 4))  # asks more tokens than were drafted
    assert not a.serves(step([3, 4], 12, 3, full=True))  # a new stream: state is gone
    taken = a.taken(2)
    assert taken.tokens == [5, 7] and taken.ahead_outcome == AHEAD_PUSHED
    assert taken.q.rows() == q.rows()[:2]
