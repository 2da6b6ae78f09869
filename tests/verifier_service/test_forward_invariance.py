"""A verified row gets a decode row's numbers: the target's logits for a position are the same
bits whether the position is decoded alone, verified as a row of a draft chain or a tree, or
shares its step with other sequences, on the CPU's lean forward (packed fp16 products and the
step kernels of kernels/cpu_step.py). Greedy speculation is lossless because of this, not
merely close to it."""

from __future__ import annotations

import planted_bugs as bug
import pytest
import torch
from paged_testlib import SMALL, plain_and_paged
from transformers import LlamaConfig, LlamaForCausalLM

from kernels import cpu_step
from kernels.layout import StepLayout
from verifier_service.kv.cache import BlockTable, KVCacheSpec, PagedKVCache
from verifier_service.model.runner import ModelRunner

pytestmark = pytest.mark.skipif(cpu_step.library() is None, reason="no C++ kernels here")


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    _, paged = plain_and_paged(tmp_path_factory.mktemp("m"), LlamaForCausalLM,
                               LlamaConfig(**SMALL))
    with torch.no_grad():  # fp16-exact weights, as a checkpoint stored in fp16
        for p in paged.parameters():
            p.copy_(p.half().float())
    kv = PagedKVCache(KVCacheSpec.for_model(paged.config, torch.float32, block_size=4,
                                            memory_bytes=0, num_blocks=80), torch.device("cpu"))
    return ModelRunner(paged, torch.device("cpu"), kv)


def check_verified_rows_match_decoded_rows(runner) -> None:
    g = torch.Generator().manual_seed(7)
    seq = torch.randint(0, 101, (30,), generator=g).tolist()
    other = torch.randint(0, 101, (30,), generator=g).tolist()
    tables = [BlockTable() for _ in range(4)]
    for t in tables:
        runner.kv.reserve(t, 30)
    for t, s in zip(tables, (seq, seq, seq, other)):  # the same 20-token prompts
        runner.forward(s[:20], [t], StepLayout.build([20], [0], [0], [False]))
    decoded = []
    for i in range(20, 25):  # table 0: decoded one position at a time
        row, _ = runner.forward([seq[i]], [tables[0]], StepLayout.build([1], [i], [0], [True]))
        decoded.append(row[0])
    # table 1: a chain of 4 drafts verified in one step, alone
    chain, _ = runner.forward(seq[20:25], [tables[1]], StepLayout.build([5], [20], [4], [True]))
    # table 2: a tree whose first branch is the sequence, beside another sequence's prefill
    nodes = seq[21:24] + [(seq[22] + 1) % 101]
    both, _ = runner.forward([seq[20]] + nodes + other[20:30], [tables[2], tables[3]],
                             StepLayout.build([5, 10], [20, 20], [4, 0], [True, True],
                                              [[-1, 0, 1, 0], None]))
    for i in range(5):
        assert torch.equal(chain[i], decoded[i]), f"chain row {i}"
    for i in range(4):  # the tree's root row and its first branch (nodes 0, 1, 2)
        assert torch.equal(both[i], decoded[i]), f"tree row {i}"


def test_verified_rows_get_the_decoded_rows_bits(runner):
    check_verified_rows_match_decoded_rows(runner)


def test_the_check_fails_on_step_kernels_whose_rows_depend_on_the_batch(runner, monkeypatch):
    bug.cpu_step_rows_depend_on_the_row_count(monkeypatch)
    with pytest.raises(AssertionError):
        check_verified_rows_match_decoded_rows(runner)
