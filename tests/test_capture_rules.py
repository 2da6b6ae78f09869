"""The capture check itself (tests/capture_rules.py): every way a body can read a value back to
the host, or take a shape from values, fails it on CPU tensors; the device-side forms that
replace them pass."""

import pytest
import torch
from capture_rules import GraphSafe

T = torch.arange(6.0)
MASK = T > 2

READS = {
    "item": lambda: T[0].item(),
    "int": lambda: int(T[0]),
    "bool": lambda: bool(T[0] > 1),
    "tolist": lambda: T.tolist(),
    "numpy": lambda: T.numpy(),
    "nonzero": lambda: T.nonzero(),
    "boolean mask read": lambda: T[MASK],
    "boolean mask write": lambda: T.clone().__setitem__(MASK, 0.0),
    "masked_select": lambda: T.masked_select(MASK),
    "unique": lambda: T.unique(),
}


@pytest.mark.parametrize("name", sorted(READS))
def test_a_read_back_fails_the_check(name):
    with pytest.raises(AssertionError, match="host read"), GraphSafe():
        READS[name]()


def test_host_values_copied_in_fail_the_check():
    with pytest.raises(AssertionError, match="host array copied in"), GraphSafe():
        T + torch.tensor([1.0, 2, 3, 4, 5, 6])
    with pytest.raises(AssertionError, match="host value copied in"), GraphSafe():
        T.clone()[torch.arange(2)] = 1.0


def test_the_device_side_forms_pass():
    with GraphSafe():
        out = T.clone()
        out.masked_fill_(MASK, 0.0)  # a mask applied in place: no shape made of values
        out[:2] = 1.0  # a fill through basic indexing
        out = torch.where(MASK, out, -out).gather(0, T.long().flip(0)).argmax(-1, keepdim=True)
        assert out.shape == (1,) and len(T) == 6  # shapes are host facts, not values
