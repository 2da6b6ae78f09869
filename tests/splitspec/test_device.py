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


def test_a_cuda_device_takes_cudnn_out_of_attention(monkeypatch):
    """cuDNN's SDPA builds a plan per new shape (serving's shapes change every step): every
    service that resolves a CUDA device runs attention without it; the CPU is left alone."""
    was = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        resolve_device("cpu")
        assert torch.backends.cuda.cudnn_sdp_enabled()
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        assert resolve_device("cuda") == torch.device("cuda")
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(was)
