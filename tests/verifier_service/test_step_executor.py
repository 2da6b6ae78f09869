"""The step executor (verifier_service/step/executor.py) on a tiny random Llama: a padded bucket
step computes what the exact step computes for every real row and touches no cache slot but its
own rows' and the trash block's; the trash block is never read as context; the step body runs
on meta tensors, so any host sync inside it (what a captured graph cannot hold) fails here."""

from __future__ import annotations

import asyncio
import copy

import planted_bugs as bug
import pytest
import torch
from capture_rules import GraphSafe
from paged_testlib import SMALL, plain_and_paged
from transformers import LlamaConfig, LlamaForCausalLM

from kernels.layout import StepLayout
from verifier_service.kv.cache import BlockTable, KVCacheSpec, PagedKVCache
from verifier_service.model.runner import ModelRunner
from verifier_service.step.executor import StepExecutor
from verifier_service.step.plan import Bucket, BucketLadder

BS = 4
LADDER = BucketLadder((1, 4), (1, 2, 4, 8))


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    _, paged = plain_and_paged(tmp_path_factory.mktemp("tiny"), LlamaForCausalLM,
                               LlamaConfig(**SMALL))
    return paged


def _runner(model, device="cpu") -> ModelRunner:
    spec = KVCacheSpec.for_model(model.config, torch.float32, BS, 0, num_blocks=24)
    return ModelRunner(model, torch.device(device), PagedKVCache(spec, torch.device(device)),
                       linear="dense", max_model_len=64)


def _prefilled(runner):
    """Two sequences with cached prompts (13 and 6 tokens) and room for 8 more rows each."""
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, SMALL["vocab_size"], (n,), generator=g).tolist()
               for n in (13, 6)]
    tables = [BlockTable(), BlockTable()]
    for t, p in zip(tables, prompts):
        runner.kv.reserve(t, len(p) + 8)
    layout = StepLayout.build([13, 6], [0, 0], [0, 0], [False, False])
    runner.forward(prompts[0] + prompts[1], tables, layout)
    return prompts, tables


# a verify step: sequence 0 a chain of 3 drafts, sequence 1 two sibling drafts: in bucket 4 x 4,
# sequence 1 has a padding row and two padding sequences follow
STEP = dict(query_lens=[4, 3], start=[13, 6], ks=[3, 2], trees=[None, [-1, -1]],
            ids=[5, 6, 7, 8, 9, 10, 11])


def _run(runner, ladder, poison_trash=False):
    """The STEP through an executor with `ladder` over a freshly prefilled cache: the plan, the
    ragged logits rows [T_out, V], and the keys before and after it."""
    executor = StepExecutor(runner, ladder)
    _, tables = _prefilled(runner)
    before = runner.kv.k.clone()
    if poison_trash:
        trash = slice(runner.kv.trash_block * BS, (runner.kv.trash_block + 1) * BS)
        runner.kv.k[:, trash] = 1e4
        runner.kv.v[:, trash] = -1e4
    layout = StepLayout.build(STEP["query_lens"], STEP["start"], STEP["ks"], [True, True],
                              STEP["trees"])
    plan = executor.plan(layout, STEP["ids"], [t.blocks for t in tables])
    out = executor.execute(plan)
    logits = (out.logits if plan.bucket is None
              else out.logits[out.views["real_rows"][:layout.logits_indices.numel()]])
    return plan, logits, before, runner.kv.k.clone()


def check_padding_changes_nothing_real(model):
    exact_plan, exact, _, k0 = _run(_runner(model), BucketLadder())
    plan, padded, before, k1 = _run(_runner(model), LADDER)
    assert exact_plan.bucket is None and plan.bucket == Bucket(4, 4)
    torch.testing.assert_close(padded, exact, rtol=1e-5, atol=1e-5)
    # the real rows' slots hold the same keys (up to the matmul's rounding at another row
    # count); every other slot but the trash block's is untouched
    fed = exact_plan.fields.views(exact_plan.host)["slots"]
    torch.testing.assert_close(k1[:, fed], k0[:, fed], rtol=1e-6, atol=1e-6)
    other = torch.ones(k0.shape[1], dtype=torch.bool)
    other[fed] = False
    trash = _runner(model).kv.trash_block
    other[trash * BS:(trash + 1) * BS] = False
    # compared as bits: slots never written hold whatever the allocation held, NaN patterns
    # included, which torch.equal calls unequal to themselves
    assert torch.equal(k1[:, other].view(torch.uint8), before[:, other].view(torch.uint8))


def test_padding_rows_change_no_real_row_or_slot(model):
    check_padding_changes_nothing_real(model)


def test_the_check_catches_padding_written_into_a_sequences_blocks(model, monkeypatch):
    bug.padding_rows_write_into_their_sequence(monkeypatch)
    with pytest.raises(AssertionError):
        check_padding_changes_nothing_real(model)


def test_the_trash_block_is_never_read_as_context(model):
    _, clean, _, _ = _run(_runner(model), LADDER)
    _, poisoned, _, _ = _run(_runner(model), LADDER, poison_trash=True)
    torch.testing.assert_close(poisoned, clean, rtol=1e-5, atol=1e-5)


def _body_on_meta(model, ladder):
    """The step body (what a graph records) over meta tensors: values do not exist, so any read
    back to the host (.item(), .tolist(), int(t), a data-dependent shape) raises."""
    meta = _runner(copy.deepcopy(model).to("meta"), "meta")  # the module's model stays real
    executor = StepExecutor(meta, ladder)
    layout = StepLayout.build(STEP["query_lens"], STEP["start"], STEP["ks"], [True, True],
                              STEP["trees"])
    tables = [[0, 1, 2, 3, 4], [5, 6, 7]]
    plan = executor.plan(layout, STEP["ids"], tables)
    views = plan.fields.views(plan.host.to("meta"))
    with GraphSafe():
        return executor.body(views, plan), plan


@pytest.mark.parametrize("ladder", [LADDER, BucketLadder()], ids=["bucket", "exact"])
def test_the_step_body_never_reads_the_device(model, ladder):
    out, plan = _body_on_meta(model, ladder)
    assert (plan.bucket is not None) == (ladder is LADDER)
    assert out.logits.device.type == "meta" and out.tokens.shape[0] == plan.fields.size("S")


def test_the_check_catches_a_read_back_inside_the_body(model, monkeypatch):
    bug.greedy_verification_reads_back(monkeypatch)
    with pytest.raises((RuntimeError, NotImplementedError, AssertionError)):
        _body_on_meta(model, LADDER)


def test_bucketed_steps_serve_what_exact_steps_serve(target_model_dir):
    """The whole engine with the toy target, every decode step padded into a bucket (as on a
    device that captures) against exact shapes: chains, lookahead's trees, plain decoding and
    seeded sampling in one batch, token for token."""
    from engine_testlib import PROMPTS, make_engine, request, run_all

    from splitspec.params import SamplingParams

    def serve(padded: bool):
        engine = make_engine(target_model_dir, max_num_seqs=4)
        if padded:
            engine.executor = StepExecutor(engine.runner, BucketLadder.powers_of_two(4, 9))
        seeded = SamplingParams(temperature=0.8, seed=11)
        inputs = [request(engine, "chain", PROMPTS[0], 24, k=4),
                  request(engine, "tree", PROMPTS[1], 24, method="lookahead", k=8),
                  request(engine, "off", PROMPTS[2], 24),
                  request(engine, "seeded", PROMPTS[3], 24, k=4, sampling=seeded)]
        return [tokens for tokens, _, _ in asyncio.run(run_all(engine, inputs))], engine

    exact, _ = serve(False)
    padded, engine = serve(True)
    assert padded == exact
    stats = engine.executor.stats
    assert stats.bucket_steps > 10 and stats.captured_steps == 0  # no graphs on the CPU


def test_eager_steps_on_a_device_that_captures_are_counted_by_reason_and_logged_once(model,
                                                                                     caplog):
    runner = _runner(model)
    executor = StepExecutor(runner, LADDER)
    executor.graphs_wanted = True  # as on a device that captures, where no graph was captured
    _, tables = _prefilled(runner)
    blocks = [t.blocks for t in tables]
    verify = executor.plan(StepLayout.build(STEP["query_lens"], STEP["start"], STEP["ks"],
                                            [True, True], STEP["trees"]), STEP["ids"], blocks)
    chunk = executor.plan(StepLayout.build([3, 1], [13, 6], [0, 0], [False, False]),
                          [1, 2, 3, 4], blocks)  # three more prompt tokens beside a decode row
    with caplog.at_level("WARNING", logger="splitspec.graphs"):
        for plan in (verify, verify, chunk):
            executor.execute(plan)
    assert verify.bucket == Bucket(4, 4) and chunk.bucket is None
    assert executor.stats.eager_steps == {"not_captured": 2, "prefill": 1}
    assert executor.stats.captured_steps == 0
    assert len(caplog.records) == 2  # once per reason and shape
    assert "not_captured" in caplog.records[0].getMessage()
    assert "prefill" in caplog.records[1].getMessage()
