"""The verify step on small in-memory pieces: a runner whose next token is a fixed function of the
fed token stands in for the target, so what each sequence feeds, keeps and emits is known."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from splitspec.params import GenerationInput, SamplingParams
from splitspec.proposal import Draft
from verifier_service.batching.scheduler import Scheduled
from verifier_service.batching.sequence import SequenceState
from verifier_service.step.executor import StepExecutor
from verifier_service.step.verify import verify_step

V = 32


class SuccessorRunner:
    """Greedy next token after t is t + 1 (mod V); each logits row's hidden state is its input
    row index. Records what it was fed (through a step executor, as the engine runs it)."""

    device = torch.device("cpu")
    kv = SimpleNamespace(block_size=4, trash_block=99)
    max_model_len = 64
    vocab_size = V

    def run_plan(self, views, plan, out=None):
        self.input_ids, self.layout = views["ids"].tolist(), plan.layout
        rows = views["logits_rows"]
        logits = torch.nn.functional.one_hot((views["ids"][rows] + 1) % V, V).float() * 8.0
        hidden = rows.float()[:, None].repeat(1, 3)  # [T_out, 3]
        return logits, hidden


def _executor() -> StepExecutor:
    return StepExecutor(SuccessorRunner())


def _seq(tokens, computed, top_logprobs=None, sampling=None) -> SequenceState:
    inp = GenerationInput("s", tuple(tokens), sampling or SamplingParams(temperature=0.0),
                          top_logprobs=top_logprobs)
    seq = SequenceState(inp=inp, tracker=None)  # the verify step never reads the output tracker
    seq.num_computed = computed
    seq.blocks.blocks = [0, 1, 2]  # room for 12 positions
    return seq


def test_each_sequence_feeds_its_rows_and_keeps_its_accepted_prefix():
    executor = _executor()
    runner = executor.runner
    decode = _seq([3, 4, 5], 2)  # feeds 5, then drafts 6 7 9: 6 and 7 accepted, 8 recovered
    chunk = _seq([10, 11, 12, 13, 14], 0)  # a prefill chunk of 2 that does not end the prompt
    last_chunk = _seq([20, 21, 22, 23], 1)  # feeds 21 22 23: ends the prompt, emits 24
    allright = _seq([1, 2], 1)  # feeds 2, drafts 3 4: both accepted, bonus 5
    batch = [Scheduled(decode, 1, 3), Scheduled(chunk, 2, 0), Scheduled(last_chunk, 3, 0),
             Scheduled(allright, 1, 2)]
    drafts = [Draft("a", [6, 7, 9]), None, None, Draft("d", [3, 4])]
    results = verify_step(executor, batch, drafts, [True, False, False, False])
    assert runner.input_ids == [5, 6, 7, 9, 10, 11, 21, 22, 23, 2, 3, 4]
    assert runner.layout.positions().tolist() == [2, 3, 4, 5, 0, 1, 1, 2, 3, 1, 2, 3]
    a, b, c, d = results
    assert b is None
    assert (a.tokens, a.num_accepted, list(a.kept_rows)) == ([6, 7, 8], 2, [0, 1, 2])
    assert (c.tokens, c.num_accepted, list(c.kept_rows)) == ([24], 0, [0, 1, 2])
    assert (d.tokens, d.num_accepted, list(d.kept_rows)) == ([3, 4, 5], 2, [0, 1, 2])
    # the hidden state that produced a's last token: the row of its second draft (input row 2)
    assert a.hidden.tolist() == [2.0, 2.0, 2.0] and c.hidden is None


def test_logprobs_come_from_the_rows_that_picked_each_token():
    executor = _executor()
    seq = _seq([3, 4, 5], 2, top_logprobs=2)
    plain = _seq([7, 8], 1)
    (r, p) = verify_step(executor, [Scheduled(seq, 1, 2), Scheduled(plain, 1, 0)],
                         [Draft("a", [6, 0]), None], [False, False])
    assert r.tokens == [6, 7] and p.logprobs is None
    assert [top[0][0] for _, top in r.logprobs] == [6, 7]  # each row's most likely is its token
    assert all(chosen == top[0][1] for chosen, top in r.logprobs)


def test_a_seeded_sampled_sequence_is_reproducible_and_keeps_what_it_accepts():
    def run():
        seq = _seq([3, 4, 5], 2, sampling=SamplingParams(temperature=1.0, seed=7))
        (r,) = verify_step(_executor(), [Scheduled(seq, 1, 3)],
                           [Draft("a", [6, 7, 9])], [False])
        return r

    first, again = run(), run()
    assert (first.tokens, first.kept_rows) == (again.tokens, again.kept_rows)
    # the target puts ~all mass on the successor: 6 and 7 accepted, 9 rejected
    assert first.num_accepted == 2 and first.tokens[:2] == [6, 7]
    assert list(first.kept_rows) == [0, 1, 2]


@pytest.mark.parametrize("mode", ["processed_logprobs", "raw_logprobs"])
def test_logprobs_describe_the_processed_or_the_raw_distribution(mode):
    executor = _executor()
    executor.logprobs_mode = mode
    # the successor of 5 is 6: a bias of -100 on it makes 6's processed logprob tiny
    seq = _seq([3, 4, 5], 2, top_logprobs=1,
               sampling=SamplingParams(temperature=0.0, logit_bias=((6, -100.0),)))
    (r,) = verify_step(executor, [Scheduled(seq, 1, 0)], [None], [False])
    assert r.tokens != [6]  # the bias decided the greedy token
    chosen, top = r.logprobs[0]
    if mode == "raw_logprobs":  # the model's own: 6 is still its most likely token
        assert top[0][0] == 6 and chosen < top[0][1]
    else:  # the distribution the token was drawn from: the chosen token is among the likeliest
        assert chosen == top[0][1] and top[0][0] != 6
