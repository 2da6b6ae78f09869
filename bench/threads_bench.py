"""The stack's default threads against torch's (every process one thread per core), through
`splitspec up`'s Stack, on Spec-Bench questions (bench/reports/threads.md).

    python bench/threads_bench.py [--model DIR] [--per-group 1] [--max-tokens 128]
        [--configs off draft] [--rounds 2] [--out bench/reports/threads.md]

Two stacks run side by side, idle but for the request in flight: one with the defaults a user
gets (splitspec/launcher/threads.py), one with every service at torch's default. Each question
goes to both, in turn, for each configuration (off; draft k=3), over --rounds passes, so load
that comes and goes on a shared machine falls on both alike. Greedy, batch 1, the question's
first turn through the chat endpoint. Reported: tokens/s per configuration and threads (mean
over questions of each question's tokens over its wall time), tokens per step, and whether the
two stacks' answers are identical. A dated section is appended to --out.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import httpx  # noqa: E402
from specbench_data import load, pick  # noqa: E402

from splitspec.launcher import Stack, StackConfig, sibling_proposer_models  # noqa: E402
from splitspec.launcher.threads import THREADS_ENV, host_cores  # noqa: E402

CONFIGS = {"off": {"mode": "off"},
           "draft": {"mode": "on", "method": "draft", "num_speculative_tokens": 3}}


def start(model: str, draft: str, torch_default: bool) -> Stack:
    stack = Stack(StackConfig.with_free_ports(model=model, device="cpu",
                                              models={"draft": draft}, methods=["draft"]))
    if torch_default:  # what every service ran before the stack chose: one thread per core
        for svc in stack.services:
            svc.env[THREADS_ENV] = str(host_cores())
    stack.start()
    return stack


def ask(client: httpx.Client, url: str, question: str, speculation: dict,
        max_tokens: int) -> tuple[float, int, int, list[str]]:
    """(seconds, completion tokens, engine steps, the answer's text)."""
    body = {"messages": [{"role": "user", "content": question}], "max_tokens": max_tokens,
            "temperature": 0, "speculation": speculation}
    t0 = time.perf_counter()
    r = client.post(f"{url}/v1/chat/completions", json=body)
    seconds = time.perf_counter() - t0
    r.raise_for_status()
    out = r.json()
    usage = out["usage"]
    steps = (usage.get("speculation") or {}).get("steps") or usage["completion_tokens"]
    return seconds, usage["completion_tokens"], steps, out["choices"][0]["message"]["content"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(ROOT / "models/smollm2-135m-instruct"))
    ap.add_argument("--per-group", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "bench/reports/threads.md"))
    args = ap.parse_args()
    draft = sibling_proposer_models(args.model).get("draft")
    if not draft:
        raise SystemExit(f"no draft model next to {args.model}")
    questions = pick(load(), args.per_group)
    load_start = os.getloadavg()
    began = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    stacks = {"default": start(args.model, draft, False), "torch": start(args.model, draft, True)}
    threads = {k: {svc.name: svc.env[THREADS_ENV] for svc in s.services}
               for k, s in stacks.items()}
    rows: dict[tuple[str, str], list[tuple[float, int, int]]] = {}
    answers: dict[tuple[str, str, int], str] = {}
    t_run = time.perf_counter()
    try:
        with httpx.Client(timeout=600) as client:
            for s in stacks.values():  # warm-up: first forwards, the draft's first call
                for cfg in args.configs:
                    ask(client, s.url, "Say hello.", CONFIGS[cfg], 8)
            for _ in range(args.rounds):
                for q in questions:
                    for cfg in args.configs:
                        for name, s in stacks.items():
                            sec, toks, steps, text = ask(client, s.url, q.turns[0],
                                                         CONFIGS[cfg], args.max_tokens)
                            rows.setdefault((cfg, name), []).append((sec, toks, steps))
                            answers[(cfg, name, q.question_id)] = text
    finally:
        for s in stacks.values():
            s.stop()
    seconds = time.perf_counter() - t_run
    load_end = os.getloadavg()
    same = all(answers[(c, "default", q.question_id)] == answers[(c, "torch", q.question_id)]
               == answers[("off", "default", q.question_id)]
               for c in args.configs for q in questions)

    def rate(cfg: str, name: str) -> float:
        return statistics.mean(t / s for s, t, _ in rows[(cfg, name)])

    def per_step(cfg: str, name: str) -> float:
        return sum(t for _, t, _ in rows[(cfg, name)]) / sum(n for _, _, n in rows[(cfg, name)])

    def show(name: str) -> str:
        return ", ".join(f"{k} {v}" for k, v in threads[name].items())

    off = {n: rate("off", n) for n in stacks} if "off" in args.configs else None
    lines = [f"## {began}: the stack's default threads against torch's", "",
             f"`python bench/threads_bench.py --per-group {args.per_group} --max-tokens "
             f"{args.max_tokens} --rounds {args.rounds}` at commit "
             + os.popen(f"git -C {ROOT} rev-parse --short HEAD").read().strip()
             + f": {len(questions)} Spec-Bench questions (the first of each group, first turn),"
             f" greedy, batch 1, up to {args.max_tokens} tokens, {args.rounds} rounds; the two "
             "stacks side by side, each question sent to one then the other. "
             f"{host_cores()} cores; load average (1/5/15 min) "
             f"{', '.join(f'{x:.2f}' for x in load_start)} at the start and "
             f"{', '.join(f'{x:.2f}' for x in load_end)} at the end ({seconds:.0f} s of "
             "requests): other work shared the machine, so the numbers are indicative.", "",
             f"- default (splitspec/launcher/threads.py): {show('default')}",
             f"- torch (before: every process one thread per core): {show('torch')}", "",
             "| configuration | threads | tok/s | tokens / step | vs off, same threads |",
             "|---|---|---:|---:|---:|"]
    for cfg in args.configs:
        for name in stacks:
            vs = f"{rate(cfg, name) / off[name]:.2f}x" if off else "-"
            lines.append(f"| {cfg} | {name} | {rate(cfg, name):.1f} | "
                         f"{per_step(cfg, name):.2f} | {vs} |")
    lines += ["", "Ratio default / torch: " + ", ".join(
        f"{cfg} {rate(cfg, 'default') / rate(cfg, 'torch'):.2f}x" for cfg in args.configs)
        + ". Every answer identical across both stacks and to off's: "
        + ("yes" if same else "NO") + ".", ""]
    text = "\n".join(lines)
    print(text)
    out = Path(args.out)
    head = "" if out.exists() else (
        "# Threads between processes\n\nWhat the stack's default threads per service "
        "(splitspec/launcher/threads.py) are worth against every process at torch's default, "
        "measured by `bench/threads_bench.py`; newest last.\n\n")
    with out.open("a") as f:
        f.write(head + text + "\n")


if __name__ == "__main__":
    main()
