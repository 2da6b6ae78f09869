"""An EAGLE head under tensor parallelism drafts on rank 0 alone, and there the target's
vocabulary tables are sharded: rank 0 keeps whole copies of the ones the head reads
(ModelRunner keep_whole, taken by the head at start-up).

- Rank 0's head reads the target's whole token embedding and (EAGLE-1/2) scores with its whole
  output head: the numbers of the same head bound at TP 1. Shown for the shipped toy EAGLE-3
  head (its own lm_head: the embedding only) and a random EAGLE-1 head on a tiny Llama (both).
- The runner lets go of its copies once the head has them; the other ranks keep none.
- A head that reads rank 0's shard as if it were the table is caught (planted control).

Greedy EAGLE chains and trees through a TP 2 engine, equal to plain decoding with drafts
accepted: tests/verifier_service/test_tensor_parallel_engine.py.
"""

from __future__ import annotations

import dataclasses

import planted_bugs
import pytest
import torch
from eagle_testlib import head_for_target
from tp_testlib import ThreadRanks, tiny_family

from verifier_service.config import VerifierConfig
from verifier_service.methods.eagle.method import EagleMethod
from verifier_service.model.target import build_runner


def _bound(config: VerifierConfig, group=None):
    """(rank's runner, the EAGLE method bound on it). Loading cuts the shards without any
    collective, so a rank's stand-in group needs no other rank running."""
    runner, _, _ = build_runner(config, group)
    method = EagleMethod.from_verifier(runner.vocab_size, config)
    method.bind(runner)
    return runner, method


@pytest.fixture(scope="module", params=["toy-eagle3", "tiny-eagle1"])
def head_config(request, target_model_dir, tmp_path_factory) -> VerifierConfig:
    if request.param == "toy-eagle3":
        return VerifierConfig(model=target_model_dir, eagle=f"{target_model_dir}-eagle",
                              threads=1, warmup=False, graphs="off")
    tmp = tmp_path_factory.mktemp("tiny-eagle1")
    model = tiny_family("llama", tmp / "target", sliding_window=None)
    head = head_for_target(tmp / "head", model, version=1, seed=3)
    return VerifierConfig(model=model, eagle=str(head), threads=1, warmup=False, graphs="off")


def check_rank0_head_matches_tp1(config: VerifierConfig) -> None:
    """Rank 0 of TP 2 binds a head that embeds and scores as the same head at TP 1 does."""
    _, single = _bound(config)
    groups = ThreadRanks(2).groups
    runner, method = _bound(dataclasses.replace(config, tensor_parallel_size=2), groups[0])
    assert method.head.embed.shape == single.head.embed.shape
    assert torch.equal(method.head.embed, single.head.embed)
    x = torch.randn(5, method.head.spec.hidden_size, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(method.head.logits(x), single.head.logits(x))
    assert runner._whole == {}  # handed over: the head holds what it reads, nothing twice


def test_rank_0s_head_reads_the_whole_tables_and_scores_as_at_tp1(head_config):
    check_rank0_head_matches_tp1(head_config)


def test_a_head_reading_rank_0s_shard_as_the_table_is_caught(head_config, monkeypatch):
    planted_bugs.eagle_tp_head_reads_the_rank_shard(monkeypatch)
    with pytest.raises(AssertionError):
        check_rank0_head_matches_tp1(head_config)


def test_other_ranks_keep_no_whole_tables(head_config):
    config = dataclasses.replace(head_config, tensor_parallel_size=2)
    runner, _, _ = build_runner(config, ThreadRanks(2).groups[1])
    assert runner._whole == {}
    assert runner.take_vocab_tables() == (None, None)


def test_a_rank_that_kept_no_tables_refuses_the_head_naming_why(head_config):
    config = dataclasses.replace(head_config, tensor_parallel_size=2)
    runner, _, _ = build_runner(dataclasses.replace(config, eagle=""),
                                ThreadRanks(2).groups[0])
    with pytest.raises(ValueError, match="holds no whole embed"):
        EagleMethod.from_verifier(runner.vocab_size, config).bind(runner)
