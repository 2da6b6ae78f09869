"""Tokens per step of hybrid drafts against their components, on the toy family (no timing).

    python bench/hybrid_steps.py [--prompts 4] [--max-tokens 64] [--k 6] [--configs ...]
        [--max-k N]

One stack (gateway-less: the verifier's gRPC Generation API), greedy, one request at a time.
Prompts: held-out code windows ("open") and the same windows followed by their own first
lines, so that the answer quotes the prompt ("quoting"). Per configuration and prompt kind:
tokens per step (completion tokens / steps) and accepted / proposed draft tokens. Suffix
decoding remembers every answer it served: its proposer is restarted before each
configuration that uses it. Every output is checked against speculation off.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from spec_bench import held_out_prompts  # noqa: E402

from protos import common_pb2, generation_pb2_grpc  # noqa: E402
from splitspec.launcher import Stack, StackConfig  # noqa: E402
from splitspec.methods import components_of  # noqa: E402

CONFIGS = ["ngram", "suffix", "draft", "mlp", "eagle", "hybrid:ngram+draft",
           "hybrid:ngram+mlp", "hybrid:ngram+eagle", "hybrid:suffix+eagle",
           "hybrid:suffix+draft", "hybrid:ngram+suffix", "hybrid:suffix|eagle",
           "hybrid:ngram|eagle", "hybrid:ngram|draft", "hybrid:suffix|ngram"]


def prompts(n: int) -> dict[str, list[str]]:
    code = held_out_prompts(n, chars=300)
    quoting = [p + "\n\n" + "\n".join(p.splitlines()[:2]) for p in code]
    return {"open": code, "quoting": quoting}


def generate(stub, prompt: str, method: str | None, k: int, max_tokens: int):
    spec = (common_pb2.SpeculationConfig(mode=common_pb2.SPECULATION_MODE_OFF) if method is None
            else common_pb2.SpeculationConfig(mode=common_pb2.SPECULATION_MODE_ON,
                                              method=method, num_speculative_tokens=k))
    req = common_pb2.GenerateRequest(
        text=prompt, sampling=common_pb2.SamplingParams(temperature=0.0), speculation=spec,
        stopping=common_pb2.StoppingCriteria(max_tokens=max_tokens, ignore_eos=True))
    ids, usage = [], None
    for chunk in stub.Generate(req, timeout=600):
        ids += chunk.token_ids
        if chunk.HasField("usage"):
            usage = chunk.usage
    return ids, usage


def reconnected(stub, tries: int = 50) -> None:
    """Wait until the verifier drafts with the restarted suffix proposer again (it reconnects
    with a backoff: until then a request decodes without its drafts, and a gated hybrid falls
    through to its next tier). The probe's prompt has nothing the measured prompts copy."""
    import time

    for _ in range(tries):
        _, usage = generate(stub, "Name one river.", "suffix", 2, 2)
        if not usage.speculation.reason:
            return
        time.sleep(0.2)
    raise RuntimeError("the suffix proposer did not reconnect")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=6)
    ap.add_argument("--configs", nargs="*", default=CONFIGS)
    ap.add_argument("--max-k", type=int, default=None,
                    help="the verifier's --max-num-speculative-tokens (its default: unset)")
    args = ap.parse_args()
    models = ROOT / "models"
    import grpc

    cfg = StackConfig.with_free_ports(
        model=str(models / "target"), device="cpu", log_dir=Path(tempfile.mkdtemp()),
        verifier_args=["--threads", "1", "--proposer-timeout-ms", "5000",
                       *(["--max-num-speculative-tokens", str(args.max_k)] if args.max_k
                         else [])],
        models={"draft": str(models / "draft"), "mlp": str(models / "mlp-speculator"),
                "eagle": str(models / "target-eagle")},
        proposer_args={"draft": ["--threads", "1"], "mlp": ["--threads", "1"]})
    sets = prompts(args.prompts)
    rows = []
    with Stack(cfg) as stack, grpc.insecure_channel(f"127.0.0.1:{cfg.grpc_port}") as ch:
        stub = generation_pb2_grpc.GenerationStub(ch)
        off = {p: generate(stub, p, None, 0, args.max_tokens)[0]
               for ps in sets.values() for p in ps}
        for method in args.configs:
            if "suffix" in components_of(method):
                stack.restart(stack.proposers["suffix"])
                reconnected(stub)
            for kind, ps in sets.items():
                tokens = steps = accepted = proposed = 0
                for p in ps:
                    ids, usage = generate(stub, p, method, args.k, args.max_tokens)
                    assert ids == off[p], (method, kind, "output differs from off")
                    s = usage.speculation
                    tokens += usage.completion_tokens
                    steps += s.steps
                    accepted += s.accepted_tokens
                    proposed += s.proposed_tokens
                rows.append((method, kind, tokens / max(steps, 1), accepted, proposed))
                print(f"{method:22s} {kind:8s} tokens/step {tokens / max(steps, 1):.2f}  "
                      f"accepted {accepted}/{proposed}", flush=True)
    print("\n| method | prompts | tokens per step | accepted / proposed |\n|---|---|---|---|")
    for method, kind, tps, acc, prop in rows:
        print(f"| {method} | {kind} | {tps:.2f} | {acc} / {prop} |")


if __name__ == "__main__":
    main()
