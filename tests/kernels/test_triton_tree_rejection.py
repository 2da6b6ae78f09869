"""Triton tree sampler (run by Triton's interpreter on the CPU) == the PyTorch tree reference, on
random trees of every shape (chains, stars, deep and bushy), every draft-probability form, greedy,
seeded and unseeded rows mixed."""

from __future__ import annotations

import importlib
import importlib.util
import os
import random
import subprocess
import sys

import pytest
import torch
from kernels_testlib import random_batch

from kernels import SparseProbs, tree_rejection_sample

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)


def _interpreter_active() -> bool:
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(tl.max, InterpretedFunction)


@pytest.fixture(scope="module")
def interpreted():
    """kernels.triton_tree_rejection imported under TRITON_INTERPRET=1 (else the subprocess test
    below runs this file in a fresh interpreter)."""
    mp = pytest.MonkeyPatch()
    if "triton" not in sys.modules:
        mp.setenv("TRITON_INTERPRET", "1")
    if not _interpreter_active():
        mp.undo()
        pytest.skip("triton was imported without TRITON_INTERPRET; see the subprocess test")
    mp.setenv("TRITON_INTERPRET", "1")
    sys.modules.pop("kernels.triton_tree_rejection", None)
    mod = importlib.import_module("kernels.triton_tree_rejection")
    from triton.runtime.interpreter import InterpretedFunction

    assert isinstance(mod._tree_kernel, InterpretedFunction)
    yield mod
    sys.modules.pop("kernels.triton_tree_rejection", None)
    mp.undo()


def test_interpreted_in_subprocess():
    if "triton" not in sys.modules or _interpreter_active() or os.environ.get("KERNELS_TEST_CHILD"):
        pytest.skip("the in-process tests ran under the interpreter")
    env = dict(os.environ, TRITON_INTERPRET="1", KERNELS_TEST_CHILD="1")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           __file__], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def _parents(rng: random.Random, k: int, shape: str) -> list[int]:
    if shape == "chain":
        return list(range(-1, k - 1))
    if shape == "star":
        return [-1] * k
    if shape == "deep":
        return [max(-1, d - 1 - (rng.random() < 0.2)) for d in range(k)]
    return [rng.randint(-1, d - 1) for d in range(k)]  # bushy


def both(batch, parents, seeds, greedy):
    results = []
    for impl in ("reference", "triton"):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(321)
            results.append(tree_rejection_sample(
                batch.target_probs, batch.draft_token_ids, parents, batch.num_draft_tokens,
                batch.draft_probs, greedy, seeds, impl=impl))
    ref, tri = results
    assert torch.equal(ref.output_token_ids, tri.output_token_ids), (ref.output_token_ids,
                                                                      tri.output_token_ids)
    assert torch.equal(ref.num_accepted, tri.num_accepted)
    assert torch.equal(ref.accepted_nodes, tri.accepted_nodes)
    return ref


def check(mode, shape, ks, vocab, sharpness=(0.3, 2.0, 6.0)):
    rng = random.Random(len(ks) * 100 + vocab)
    gen = torch.Generator().manual_seed(len(ks) * 1000 + vocab)
    for trial, sharp in enumerate(sharpness):  # flat targets reject often, sharp ones accept
        greedy = [(i + trial) % 3 == 0 for i in range(len(ks))]
        batch = random_batch(ks, vocab, mode, gen, greedy=greedy, top=min(5, vocab),
                             sharpness=sharp)
        parents = [_parents(rng, k, shape) for k in ks]
        seeds = [i if (i + trial) % 2 else None for i in range(len(ks))]
        both(batch, parents, seeds, torch.tensor(greedy))


@pytest.mark.parametrize("mode", ["none", "dense", "sparse"])
@pytest.mark.parametrize("shape", ["chain", "star", "deep", "bushy"])
def test_triton_equals_reference(interpreted, mode, shape):
    check(mode, shape, [3, 0, 5, 1], 96, sharpness=(0.3, 4.0))  # one vocabulary block


@pytest.mark.parametrize("ks,vocab", [([2, 5], 2051), ([1], 7), ([0, 0], 64)],
                         ids=["several-blocks", "below-a-block", "no-drafts"])
def test_vocabulary_edges(interpreted, ks, vocab):
    check("sparse", "bushy", ks, vocab, sharpness=(0.3, 4.0))


def test_forced_sibling_rejections_and_the_residual(interpreted):
    # flat target, one-hot siblings: each rejection removes a token from p before the next sibling
    v = 30
    gen = torch.Generator().manual_seed(4)
    batch = random_batch([6, 6], v, "none", gen, sharpness=0.05)
    parents = [[-1] * 6, [-1, -1, 0, 0, 1, 1]]
    for seed in range(2):
        torch.manual_seed(seed)
        both(batch, parents, [None, None], torch.tensor([False, False]))
    batch.draft_probs = SparseProbs.one_hot(batch.draft_token_ids)
    both(batch, parents, [None, 7], torch.tensor([False, False]))
