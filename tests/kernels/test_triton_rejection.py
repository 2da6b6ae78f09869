"""Triton rejection kernel (run by Triton's interpreter on the CPU) == the PyTorch reference."""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys

import pytest
import torch
from kernels_testlib import random_batch

from kernels import SparseProbs, rejection_sample

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)


def _interpreter_active() -> bool:
    """Triton reads TRITON_INTERPRET when a @triton.jit function is *defined*: for triton's own
    library functions (tl.max, tl.argmax, ...) that is when triton is first imported."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(tl.max, InterpretedFunction)


@pytest.fixture(scope="module")
def interpreted():
    """kernels.triton_rejection imported under TRITON_INTERPRET=1, verified to be interpreted.

    When triton was already imported in this process without the variable, the in-process tests are
    skipped and `test_interpreted_in_subprocess` runs this file in a fresh interpreter instead."""
    mp = pytest.MonkeyPatch()
    if "triton" not in sys.modules:
        mp.setenv("TRITON_INTERPRET", "1")
    if not _interpreter_active():
        mp.undo()
        pytest.skip(
            "triton was imported without TRITON_INTERPRET; see test_interpreted_in_subprocess"
        )
    mp.setenv("TRITON_INTERPRET", "1")
    sys.modules.pop("kernels.triton_rejection", None)
    mod = importlib.import_module("kernels.triton_rejection")
    from triton.runtime.interpreter import InterpretedFunction

    assert isinstance(mod._rejection_kernel, InterpretedFunction)
    yield mod
    sys.modules.pop(
        "kernels.triton_rejection", None
    )  # a later import re-defines it under the real env
    mp.undo()


def test_interpreted_in_subprocess():
    if "triton" not in sys.modules or _interpreter_active() or os.environ.get("KERNELS_TEST_CHILD"):
        pytest.skip("the in-process tests ran under the interpreter")
    env = dict(os.environ, TRITON_INTERPRET="1", KERNELS_TEST_CHILD="1")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def both(batch, seeds=None, greedy=None):
    results = []
    b = len(batch.num_draft_tokens)
    for impl in ("reference", "triton"):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(123)  # unseeded rows draw the same default-RNG numbers for both
            results.append(
                rejection_sample(
                    batch.target_probs,
                    batch.draft_token_ids,
                    batch.num_draft_tokens,
                    batch.draft_probs,
                    batch.is_greedy if greedy is None else greedy,
                    seeds or [None] * b,
                    impl=impl,
                )
            )
    ref, tri = results
    assert torch.equal(ref.output_token_ids, tri.output_token_ids), (ref, tri)
    assert torch.equal(ref.num_accepted, tri.num_accepted)
    return ref


SHAPES = [
    # (ks, vocab)
    ([3, 0, 2, 5, 1, 0, 4, 2], 1500),  # vocab not a multiple of the block
    ([1], 7),  # vocab below one block
    ([0], 64),  # a single row without drafts
    ([0, 0, 0], 300),  # no drafts at all
    ([8, 8], 1024),  # max k, vocab exactly one block
    ([2, 7, 1, 3], 2051),  # several blocks plus a ragged tail
]


@pytest.mark.parametrize("mode", ["none", "dense", "sparse"])
@pytest.mark.parametrize("ks,vocab", SHAPES)
def test_triton_equals_reference(interpreted, mode, ks, vocab):
    gen = torch.Generator().manual_seed(len(ks) * 1000 + vocab)
    for trial, sharp in enumerate((0.3, 2.0, 6.0)):  # flat targets reject often, sharp ones accept
        greedy = [(i + trial) % 3 == 0 for i in range(len(ks))]
        batch = random_batch(
            ks, vocab, mode, gen, greedy=greedy, top=min(5, vocab), sharpness=sharp
        )
        seeds = [i if (i + trial) % 2 else None for i in range(len(ks))]
        both(batch, seeds)


@pytest.mark.parametrize("mode", ["none", "dense", "sparse"])
def test_all_greedy_and_all_sampled(interpreted, mode):
    gen = torch.Generator().manual_seed(9)
    ks = [2, 0, 3, 1]
    batch = random_batch(ks, 300, mode, gen, sharpness=3.0)
    both(batch, greedy=torch.ones(4, dtype=torch.bool))
    both(batch, greedy=torch.zeros(4, dtype=torch.bool))


def test_sparse_widths_and_one_hot(interpreted):
    gen = torch.Generator().manual_seed(10)
    ks = [3, 1, 4]
    for top in (1, 3, 7, 16):
        batch = random_batch(ks, 200, "sparse", gen, top=top, sharpness=2.0)
        both(batch, seeds=[1, None, 2])
    batch = random_batch(ks, 200, "none", gen)
    batch.draft_probs = SparseProbs.one_hot(batch.draft_token_ids)
    both(batch)


def test_forced_outcomes(interpreted):
    # all accepted (p one-hot at the drafts), none accepted (p(d) = 0), residual-zero fallback
    v = 40
    drafts = torch.tensor([3, 5, 9, 11])
    target = torch.zeros(6, v)
    target[0, 3] = target[1, 5] = target[2, 9] = target[3, 7] = 1.0  # row 0: 3 accepted + bonus
    target[4, :] = 1.0 / v  # row 1: draft 11 vs uniform p
    target[5, 2] = 1.0
    batch = random_batch([3, 1], v, "none", torch.Generator().manual_seed(0))
    batch.target_probs, batch.draft_token_ids = target, drafts
    res = both(batch)
    assert res.tokens()[0] == [3, 5, 9, 7]
    batch.draft_probs = target[[0, 1, 2, 4]].clone()  # q == p: every draft accepted
    both(batch)


def test_half_precision_inputs(interpreted):
    gen = torch.Generator().manual_seed(11)
    batch = random_batch([2, 3, 0], 500, "dense", gen, sharpness=1.0)
    batch.target_probs = batch.target_probs.to(torch.bfloat16)
    batch.draft_probs = batch.draft_probs.to(torch.float16)
    both(batch, seeds=[0, 1, 2])


def test_empty_batch(interpreted):
    res = rejection_sample(
        torch.zeros(0, 10),
        torch.zeros(0, dtype=torch.long),
        torch.zeros(0, dtype=torch.long),
        None,
        torch.zeros(0, dtype=torch.bool),
        [],
        impl="triton",
    )
    assert res.output_token_ids.shape == (0, 1)


def test_auto_uses_reference_on_cpu_and_import_needs_no_triton():
    # "auto" on CPU tensors never touches triton; importing kernels does not import it either
    code = (
        "import sys, torch, kernels\n"
        "assert 'triton' not in sys.modules\n"
        "p = torch.softmax(torch.randn(3, 9), -1)\n"
        "kernels.rejection_sample(p, torch.tensor([1]), torch.tensor([1, 0]), None, "
        "[False, False], [None, None])\n"
        "assert 'triton' not in sys.modules\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root, env=env, timeout=60)


_COMPILE_CHECK = r"""
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import kernels.triton_rejection as tr
fn = tr._rejection_kernel
sig = {n: "i64" if n.startswith("stride") else "i32"
       for n in ("stride_t", "stride_q", "stride_qi", "stride_e", "stride_o",
                 "V", "MAX_K", "K_SPARSE")}
for n in fn.arg_names:
    if n.endswith("_ptr"):
        sig[n] = "*i8" if n == "greedy_ptr" else (
            "*fp32" if n in ("target_ptr", "q_ptr", "uniform_ptr", "exp_ptr") else "*i64")
for q_mode in (0, 1, 2):
    consts = {"Q_MODE": q_mode, "HAS_GREEDY": True, "HAS_SAMPLED": True, "BLOCK_V": 1024,
              "BLOCK_K": 8 if q_mode == 2 else 1}
    s = dict(sig, **{k: "constexpr" for k in consts})
    src = ASTSource(fn=fn, signature=s,
                    constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()})
    assert "cubin" in triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm
"""


def test_kernel_compiles_for_cuda_without_a_gpu():
    # ahead-of-time compile (to sm_90 cubin) of every draft-probability variant; needs no device
    pytest.importorskip("triton.backends.nvidia")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    proc = subprocess.run(
        [sys.executable, "-c", _COMPILE_CHECK],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0 and ("ptxas" in proc.stderr and "not found" in proc.stderr.lower()):
        pytest.skip("no ptxas available for the ahead-of-time compile")
    assert proc.returncode == 0, proc.stderr[-3000:]
