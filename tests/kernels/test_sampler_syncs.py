"""The rejection samplers run eagerly after the captured forward, and must not stall it: with
every device tensor on the meta device (values do not exist there, so a read back raises) and
the step layout on the host, the chain and tree samplers finish, greedy, seeded and sampled rows
mixed, dense and sparse draft q, and every copy from the host to the device is non-blocking (a
blocking one makes the host wait for the stream on a GPU)."""

import planted_bugs as bug
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kernels.layout import StepLayout
from kernels.rejection import rejection_sample
from kernels.sparse_probs import SparseProbs
from kernels.tree_rejection import tree_rejection_sample

VOCAB = 50
KS = [2, 0, 1, 3]
GREEDY = [True, False, False, False]
SEEDS = [None, 7, None, 9]


class BlockingCopiesIn(TorchDispatchMode):
    """Records every copy from the host to the meta 'device' made without non_blocking."""

    def __init__(self) -> None:
        super().__init__()
        self.blocking: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.__name__
        if name.startswith("_to_copy"):
            to = kwargs.get("device")
            if (args[0].device.type == "cpu" and to is not None
                    and torch.device(to).type == "meta" and not kwargs.get("non_blocking")):
                self.blocking.append(name)
        elif name.startswith("copy_") and args[1].device.type == "cpu" \
                and args[0].device.type == "meta" and not (args[2:] or [False])[0]:
            self.blocking.append(name)
        return func(*args, **kwargs)


def _inputs(draft_q: str):
    g = torch.Generator().manual_seed(0)
    layout = StepLayout.for_drafts(KS)
    rows, drafts = sum(k + 1 for k in KS), sum(KS)
    probs = torch.softmax(torch.randn(rows, VOCAB, generator=g), -1)
    ids = torch.randint(0, VOCAB, (drafts,), generator=g)
    q = {"none": None,
         "dense": torch.softmax(torch.randn(drafts, VOCAB, generator=g), -1).to("meta"),
         "sparse": SparseProbs(torch.randint(0, VOCAB, (drafts, 4), generator=g),
                               torch.full((drafts, 4), 0.25)).to("meta")}[draft_q]
    return probs.to("meta"), ids.to("meta"), layout, q


def run_samplers_on_meta(draft_q: str) -> list[str]:
    """Both samplers over meta device tensors; the blocking copies in they made."""
    probs, ids, layout, q = _inputs(draft_q)
    with BlockingCopiesIn() as copies:
        chain = rejection_sample(probs, ids, layout, q, GREEDY, SEEDS, impl="reference")
        tree = tree_rejection_sample(probs, ids, None, layout, q, GREEDY, SEEDS,
                                     impl="reference")
    assert chain.output_token_ids.device.type == "meta"
    assert tree.output_token_ids.device.type == "meta"
    return copies.blocking


@pytest.mark.parametrize("draft_q", ["none", "dense", "sparse"])
def test_the_samplers_read_nothing_back_and_copy_in_without_blocking(draft_q):
    assert run_samplers_on_meta(draft_q) == []


def test_the_check_catches_a_read_back(monkeypatch):
    bug.sampler_reads_the_argmax_back(monkeypatch)
    with pytest.raises((RuntimeError, NotImplementedError)):
        run_samplers_on_meta("sparse")


def test_the_check_catches_a_blocking_copy_in(monkeypatch):
    bug.sampler_copies_uniforms_in_blocking(monkeypatch)
    assert run_samplers_on_meta("sparse") != []
