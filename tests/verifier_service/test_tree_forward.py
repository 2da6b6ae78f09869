"""A token tree verified in one paged forward: every node's logits equal the plain forward of its
root-to-node path, so the layout's positions and ancestor mask are what attention applies."""

from __future__ import annotations

import pytest
import torch
from paged_testlib import SMALL, plain_and_paged
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
)

from kernels.layout import StepLayout
from verifier_service.kv.cache import BlockTable, KVCacheSpec, PagedKVCache
from verifier_service.model.runner import ModelRunner


@pytest.mark.parametrize("cls, config", [
    (LlamaForCausalLM, LlamaConfig(**SMALL)),
    (MistralForCausalLM, MistralConfig(**SMALL, sliding_window=6)),
], ids=["llama-lean", "mistral-sliding-window"])
def test_tree_nodes_see_only_their_ancestors(tmp_path, cls, config):
    plain, paged = plain_and_paged(tmp_path, cls, config)
    kv = PagedKVCache(KVCacheSpec.for_model(paged.config, torch.float32, block_size=4,
                                            memory_bytes=0, num_blocks=32), torch.device("cpu"))
    runner = ModelRunner(paged, torch.device("cpu"), kv)
    g = torch.Generator().manual_seed(2)
    prefix = torch.randint(0, config.vocab_size, (9,), generator=g).tolist()
    other = torch.randint(0, config.vocab_size, (6,), generator=g).tolist()
    nodes = torch.randint(0, config.vocab_size, (6,), generator=g).tolist()
    parents = [-1, 0, -1, 2, 0, 4]  # two branches at depth 1, one at depth 2, a depth-3 leaf
    tables = [BlockTable(), BlockTable()]
    for t, n in zip(tables, (len(prefix) + len(nodes), len(other))):
        kv.reserve(t, n)
    # the prefix's last token is fed with the tree; a chain sequence shares the step
    cached = len(prefix) - 1
    runner.forward(prefix[:cached] + other[:-1], tables,
                   StepLayout.build([cached, len(other) - 1], [0, 0], [0, 0], [False, False]))
    layout = StepLayout.build([1 + len(nodes), 1], [cached, len(other) - 1], [len(nodes), 0],
                              [True, True], [parents, None])
    logits, _ = runner.forward([prefix[-1]] + nodes + [other[-1]], tables, layout)

    def path(d):
        out = []
        while d >= 0:
            out.append(nodes[d])
            d = parents[d]
        return out[::-1]

    with torch.no_grad():
        for row, ids in enumerate([prefix] + [prefix + path(d) for d in range(len(nodes))]):
            want = plain(torch.tensor([ids])).logits[0, -1]
            torch.testing.assert_close(logits[row], want, atol=1e-4, rtol=1e-4)
        want = plain(torch.tensor([other])).logits[0, -1]
        torch.testing.assert_close(logits[-1], want, atol=1e-4, rtol=1e-4)
