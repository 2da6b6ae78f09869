"""Sequences whose blocks form a few runs of consecutive slots (a cached prefix's blocks, then
their own) read their contexts run by run, no gather: a lone sequence's decode, draft-chain and
draft-tree logits, and a batch's, equal the plain transformers forward of the same tokens, for
Llama on the paged attention function (kernels/run_attention.py) and on the CPU step kernels
(verifier_service/kv/cpu_attention.py), and for Mistral with a sliding window that hides whole
runs."""

from __future__ import annotations

import planted_bugs as bug
import pytest
import torch
from paged_testlib import SMALL, plain_and_paged
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

import verifier_service.kv.paged_attention as paged_attention
from kernels import cpu_step
from kernels.layout import StepLayout
from verifier_service.kv.cache import BlockTable, KVCacheSpec, PagedKVCache
from verifier_service.model.runner import ModelRunner

# three runs of consecutive blocks (block size 4): 5 blocks, 2, then 3
BLOCKS = [2, 3, 4, 5, 6, 30, 31, 12, 13, 14]
CASES = {
    "llama": (LlamaForCausalLM, LlamaConfig(**SMALL)),
    "llama-cpu-kernels": (LlamaForCausalLM, LlamaConfig(**SMALL)),
    "mistral-sliding-window": (MistralForCausalLM, MistralConfig(**SMALL, sliding_window=6)),
}


@pytest.fixture(params=list(CASES))
def models(request, tmp_path, monkeypatch):
    """Fresh per test: a runner packs its model's layers (and lets go of their weights). The
    CPU step kernels serve the "-cpu-kernels" case only (where they load)."""
    if request.param.endswith("-cpu-kernels"):
        if cpu_step.library() is None:
            pytest.skip("no C++ kernels here")
    else:
        monkeypatch.setattr(cpu_step, "available", lambda x: False)
    cls, config = CASES[request.param]
    return plain_and_paged(tmp_path, cls, config)


def _runs_read(expected: list[int]) -> list[int]:
    """The runs the paged attention function reads: none where the step kernels attend."""
    return [] if cpu_step.available(torch.zeros(1)) else expected


def check_runs_forward_equals_plain(models) -> None:
    """Prefill 22 tokens (too many rows for the runs: gathered), then a decode step over two
    runs, a chain of 3 drafts over two, and a tree of 4 nodes over three; each step's logits against
    the plain forward. Asserts that the decode, chain and tree steps read runs."""
    plain, paged = models
    config = paged.config
    kv = PagedKVCache(KVCacheSpec.for_model(config, torch.float32, block_size=4,
                                            memory_bytes=0, num_blocks=40), torch.device("cpu"))
    runner = ModelRunner(paged, torch.device("cpu"), kv)
    g = torch.Generator().manual_seed(4)
    seq = torch.randint(0, config.vocab_size, (31,), generator=g).tolist()
    nodes = torch.randint(0, config.vocab_size, (4,), generator=g).tolist()
    table = BlockTable(blocks=list(BLOCKS))
    read = []
    real = paged_attention.attention_over_runs

    def counted(q, k, v, runs, *args):
        read.append(len(runs))
        return real(q, k, v, runs, *args)

    def last(ids):
        return plain(torch.tensor([ids])).logits[0, -1]

    with pytest.MonkeyPatch.context() as patch, torch.no_grad():
        patch.setattr(paged_attention, "attention_over_runs", counted)
        runner.forward(seq[:22], [table], StepLayout.build([22], [0], [0], [False]))
        decode, _ = runner.forward([seq[22]], [table], StepLayout.build([1], [22], [0], [True]))
        torch.testing.assert_close(decode[0], last(seq[:23]), atol=1e-4, rtol=1e-4)
        chain, _ = runner.forward(seq[23:27], [table], StepLayout.build([4], [23], [3], [True]))
        want = plain(torch.tensor([seq[:27]])).logits[0, -4:]
        torch.testing.assert_close(chain, want, atol=1e-4, rtol=1e-4)
        parents = [-1, 0, -1, 2]
        tree, _ = runner.forward([seq[27]] + nodes, [table],
                                 StepLayout.build([5], [27], [4], [True], [parents]))
        paths = [[], [nodes[0]], [nodes[0], nodes[1]], [nodes[2]], [nodes[2], nodes[3]]]
        for row, path in enumerate(paths):
            torch.testing.assert_close(tree[row], last(seq[:28] + path), atol=1e-4, rtol=1e-4)
    layers = config.num_hidden_layers
    assert read == _runs_read([2] * layers + [2] * layers + [3] * layers)


def check_batched_runs_equal_plain(models) -> None:
    """Four sequences in one step over three runs, one, four and six (past MAX_RUNS: gathered
    on its own), feeding a decode row, chains of 3 drafts and of 1, and a tree of 3 nodes:
    logits against the plain forward of each."""
    plain, paged = models
    config = paged.config
    kv = PagedKVCache(KVCacheSpec.for_model(config, torch.float32, block_size=4,
                                            memory_bytes=0, num_blocks=64), torch.device("cpu"))
    runner = ModelRunner(paged, torch.device("cpu"), kv)
    g = torch.Generator().manual_seed(5)
    cached, fed, ks = [30, 10, 12, 19], [1, 4, 2, 4], [0, 3, 1, 3]
    seqs = [torch.randint(0, config.vocab_size, (c + f,), generator=g).tolist()
            for c, f in zip(cached, fed)]
    tables = [BlockTable(blocks=list(BLOCKS)), BlockTable(blocks=[50, 51, 52, 53]),
              BlockTable(blocks=[20, 22, 24, 26]), BlockTable(blocks=[40, 42, 44, 46, 48, 56])]
    parents = [None, None, None, [-1, 0, -1]]  # the last one's drafts: a tree
    for s, c, t in zip(seqs, cached, tables):  # prefills (many rows: gathered)
        runner.forward(s[:c], [t], StepLayout.build([c], [0], [0], [False]))
    read = []
    real = paged_attention.attention_over_runs

    def counted(q, k, v, runs, *args):
        read.append(len(runs))
        return real(q, k, v, runs, *args)

    with pytest.MonkeyPatch.context() as patch, torch.no_grad():
        patch.setattr(paged_attention, "attention_over_runs", counted)
        logits, _ = runner.forward([t for s, c in zip(seqs, cached) for t in s[c:]], tables,
                                   StepLayout.build(fed, cached, ks, [True] * 4, parents))
        got = logits.split([k + 1 for k in ks])
        for s, k, rows in zip(seqs[:3], ks, got):
            want = plain(torch.tensor([s])).logits[0, -(k + 1):]
            torch.testing.assert_close(rows, want, atol=1e-4, rtol=1e-4)
        tree = seqs[3]  # its root's row, then nodes 0, 1 (child of 0) and 2
        for row, path in enumerate([[], [tree[20]], [tree[20], tree[21]], [tree[22]]]):
            want = plain(torch.tensor([tree[:20] + path])).logits[0, -1]
            torch.testing.assert_close(got[3][row], want, atol=1e-4, rtol=1e-4)
    assert read == _runs_read([3, 1, 4, 1] * config.num_hidden_layers)


def test_a_batch_over_runs_gives_the_plain_forwards_logits(models):
    check_batched_runs_equal_plain(models)


def test_a_lone_sequence_over_runs_gives_the_plain_forwards_logits(models):
    check_runs_forward_equals_plain(models)


@pytest.mark.parametrize("check", [check_runs_forward_equals_plain,
                                   check_batched_runs_equal_plain], ids=["lone", "batch"])
def test_the_check_fails_when_a_run_is_read_one_slot_late(monkeypatch, models, check):
    bug.run_read_one_slot_late(monkeypatch)
    with pytest.raises(AssertionError):
        check(models)
