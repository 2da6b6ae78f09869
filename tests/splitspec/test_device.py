import pytest
import torch

from splitspec.device import make_generator, resolve_device, resolve_dtype


def test_auto_picks_cpu_without_accelerators_and_explicit_missing_devices_fail():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(RuntimeError, match="cuda"):
        resolve_device("cuda")
    with pytest.raises(RuntimeError, match="mlu"):
        resolve_device("mlu")


def test_dtypes():
    cpu = torch.device("cpu")
    assert resolve_dtype("auto", cpu) is torch.float32
    assert resolve_dtype("auto", torch.device("cuda")) is torch.bfloat16
    assert (resolve_dtype("bf16", cpu) is torch.bfloat16
            and resolve_dtype("fp16", cpu) is torch.float16)
    with pytest.raises(ValueError):
        resolve_dtype("int4", cpu)


def test_generators_are_per_request_and_reproducible():
    a, b = make_generator(torch.device("cpu"), 5), make_generator(torch.device("cpu"), 5)
    assert torch.equal(torch.rand(4, generator=a), torch.rand(4, generator=b))
