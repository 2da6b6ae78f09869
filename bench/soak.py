"""Soak: concurrent streams through the real services on 127.0.0.1 while proposers and verifier
replicas are SIGKILLed at random (the launcher's supervisor starts them again) and clients
cancel at random. Nothing may be lost: every request that was not cancelled on purpose
completes, with exactly the output of an undisturbed run (greedy and seeded sampled), and at
the end every verifier has all its KV blocks free.

    python bench/soak.py --short                  # < 2 minutes; what the test suite runs
    python bench/soak.py [--duration-s 300]       # long mode: writes bench/reports/soak.md

Bounded in count and time: `--max-requests` and `--duration-s` (whichever ends first), then the
faults stop, the supervisor brings every service back, and the checks run. Reports requests
completed / cancelled / failed, outputs checked against the reference run and mismatches, kills
per service, KV blocks leaked per verifier, and RSS per service at the start and end of the
faulty phase (services that were killed restart small: their growth says little). Exit status
1 when a request failed, an output differed or a block leaked. `--json FILE` writes the summary.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from protos import common_pb2, generation_pb2_grpc, verifier_pb2, verifier_pb2_grpc  # noqa: E402
from splitspec.config import DEFAULT_MODEL  # noqa: E402
from splitspec.launcher import Service, Stack, StackConfig, grpc_healthy  # noqa: E402
from splitspec.methods import METHODS  # noqa: E402

PROMPTS = ["def add(a, b):\n", "class Stack:\n    def __init__(self):\n", "import os\nimport sys\n",
           "for i in range(10):\n", "# read a file line by line\n", "def fib(n):\n    if n < 2:",
           "x = [1, 2, 3]\ny = ", "while True:\n    line = ", "def main():\n    args = ",
           "try:\n    import json\nexcept", "with open(path) as f:\n", "if __name__ == '__main__':"]


@dataclass(frozen=True)
class Spec:
    """One request of the workload; the same spec always has the same output."""

    prompt: str
    method: str | None
    k: int
    max_tokens: int
    temperature: float
    seed: int | None

    def to_pb(self) -> common_pb2.GenerateRequest:
        spec = (common_pb2.SpeculationConfig(mode=common_pb2.SPECULATION_MODE_OFF)
                if self.method is None else
                common_pb2.SpeculationConfig(mode=common_pb2.SPECULATION_MODE_ON,
                                             method=self.method, num_speculative_tokens=self.k))
        sampling = common_pb2.SamplingParams(temperature=self.temperature, top_p=0.95)
        if self.seed is not None:
            sampling.seed = self.seed
        return common_pb2.GenerateRequest(
            text=self.prompt, sampling=sampling, speculation=spec,
            stopping=common_pb2.StoppingCriteria(max_tokens=self.max_tokens, ignore_eos=True))


def workload(n: int, methods: list[str], rng: random.Random, max_tokens: int) -> list[Spec]:
    """Greedy and seeded sampled requests (checkable), speculation on and off."""
    out = []
    for i in range(n):
        seeded = i % 2 == 1
        out.append(Spec(PROMPTS[i % len(PROMPTS)] + ("" if i < len(PROMPTS) else f"# {i}\n"),
                        rng.choice([None, *methods]), rng.randint(2, 5),
                        rng.randint(max_tokens // 2, max_tokens),
                        0.8 if seeded else 0.0, 1000 + i if seeded else None))
    return out


@dataclass
class Outcome:
    kind: str  # "ok" | "cancelled" | "failed"
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    error: str = ""


def run_one(stub, spec: Spec, cancel_after: int | None, timeout: float) -> Outcome:
    ids: list[int] = []
    text = ""
    call = stub.Generate(spec.to_pb(), timeout=timeout)
    try:
        for msg in call:
            ids += msg.token_ids
            text += msg.text
            if cancel_after is not None and len(ids) >= cancel_after and not msg.finish_reason:
                call.cancel()
                return Outcome("cancelled")
    except grpc.RpcError as exc:
        return Outcome("failed", error=f"{exc.code().name}: {exc.details()}")
    return Outcome("ok", ids, text)


class Tally:
    """The requests' outcomes so far (completed ones also checked against their undisturbed
    run), and what went wrong: failures and mismatches. Added to by every stream's thread."""

    def __init__(self) -> None:
        self.counts = dict.fromkeys(("completed", "cancelled", "failed", "checked",
                                     "mismatched"), 0)
        self.errors: list[str] = []
        self._lock = threading.Lock()

    def add(self, spec: Spec, out: Outcome, ref: Outcome) -> None:
        with self._lock:
            if out.kind == "cancelled":
                self.counts["cancelled"] += 1
            elif out.kind == "failed":
                self.counts["failed"] += 1
                self.errors.append(out.error)
            else:
                self.counts["completed"] += 1
                self.counts["checked"] += 1
                if (out.token_ids, out.text) != (ref.token_ids, ref.text):
                    self.counts["mismatched"] += 1
                    self.errors.append(f"output differs from the reference: {spec}")


def rss_kb(svc: Service) -> int:
    try:
        for line in Path(f"/proc/{svc.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, AttributeError):
        pass
    return 0


def engine_stats(port: int, timeout: float = 10.0) -> verifier_pb2.EngineStats:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = verifier_pb2_grpc.VerifierStub(ch).WatchStats(
            verifier_pb2.WatchStatsRequest(interval_ms=50), timeout=timeout)
        try:
            return next(iter(call))
        finally:
            call.cancel()


def wait_idle(port: int, timeout: float) -> verifier_pb2.EngineStats:
    """The verifier's stats once nothing runs (or the last seen, after timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            s = engine_stats(port)
            if (s.running == 0 and s.waiting == 0 and s.kv_blocks_free == s.kv_blocks_total) \
                    or time.monotonic() > deadline:
                return s
        except grpc.RpcError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.2)


class Chaos:
    """SIGKILLs a proposer or a verifier replica every `interval_s` (jittered), in turn: a
    random proposer, then a random verifier (only while every replica is up, so one always
    serves; else a proposer again), and so on."""

    def __init__(self, stack: Stack, interval_s: float, rng: random.Random):
        self.stack, self.interval_s, self.rng = stack, interval_s, rng
        self.kills: dict[str, int] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        turn = 0
        while not self.stop.wait(self.interval_s * self.rng.uniform(0.5, 1.5)):
            turn += 1
            verifiers_up = all(v.alive() and grpc_healthy(v.port) for v in self.stack.verifiers)
            victims = [p for p in self.stack.proposers.values() if p.alive()]
            if verifiers_up and (turn % 2 == 0 or not victims):
                victims = list(self.stack.verifiers)
            if not victims:
                continue
            victim = self.rng.choice(victims)
            try:
                os.killpg(victim.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            self.kills[victim.name] = self.kills.get(victim.name, 0) + 1


def soak(args) -> dict:
    rng = random.Random(args.seed)
    methods = ["ngram"] + (["draft"] if args.draft else [])
    models = {"draft": str(Path(args.model).parent / METHODS["draft"].model_dir)}
    config = StackConfig.with_free_ports(
        model=args.model, device="cpu", methods=methods, models=models,
        log_dir=Path(args.log_dir), verifier_replicas=args.verifier_replicas,
        verifier_args=["--threads", "1", "--proposer-timeout-ms", "1000",
                       "--proposer-reconnect-s", "0.5", "--shutdown-grace-s", "5"],
        proposer_args={"draft": ["--threads", "1"]},
        gateway_args=["--resume-wait-s", "60"])
    specs = workload(args.unique, methods, rng, args.max_tokens)
    tally = Tally()
    started = time.monotonic()
    with Stack(config) as stack:
        channel = grpc.insecure_channel(f"127.0.0.1:{config.grpc_port}")
        stub = generation_pb2_grpc.GenerationStub(channel)
        with ThreadPoolExecutor(args.streams) as pool:  # the reference: undisturbed
            refs = list(pool.map(lambda s: run_one(stub, s, None, args.timeout_s), specs))
        bad = [r.error for r in refs if r.kind != "ok"]
        if bad:
            raise SystemExit(f"the undisturbed reference run failed: {bad[:3]}")
        rss_start = {s.name: rss_kb(s) for s in stack.services}
        # Supervised from this thread: a restarted service follows the thread that started it.
        supervisor = stack.supervisor()
        chaos = Chaos(stack, args.kill_interval_s, random.Random(args.seed + 1))
        chaos_thread = threading.Thread(target=chaos.run, daemon=True)
        chaos_thread.start()
        faulty_from = time.monotonic()
        deadline = faulty_from + args.duration_s
        budget = iter(range(args.max_requests))
        budget_lock = threading.Lock()

        def client(worker: int) -> None:
            wrng = random.Random(args.seed * 1000 + worker)
            while time.monotonic() < deadline:
                with budget_lock:
                    if next(budget, None) is None:
                        return
                i = wrng.randrange(len(specs))
                cancel = (wrng.randint(1, specs[i].max_tokens)
                          if wrng.random() < args.cancel_rate else None)
                tally.add(specs[i], run_one(stub, specs[i], cancel, args.timeout_s), refs[i])

        with ThreadPoolExecutor(args.streams) as pool:
            clients = [pool.submit(client, w) for w in range(args.streams)]
            while not all(c.done() for c in clients):
                supervisor.poll()
                time.sleep(0.2)
            for c in clients:
                c.result()
        faulty_s = time.monotonic() - faulty_from
        chaos.stop.set()
        chaos_thread.join()
        back_by = time.monotonic() + 120  # every service up and healthy again
        while not all(s.alive() and grpc_healthy(s.port) for s in stack.services):
            if time.monotonic() > back_by:
                raise SystemExit("services did not come back after the faults stopped")
            supervisor.poll()
            time.sleep(0.2)
        rss_end = {s.name: rss_kb(s) for s in stack.services}
        leaked = {}
        for v in stack.verifiers:
            s = wait_idle(v.port, 60)
            leaked[v.name] = s.kv_blocks_total - s.kv_blocks_free
        channel.close()
    return {
        "mode": "short" if args.short else "long", "seed": args.seed,
        "streams": args.streams, "verifier_replicas": args.verifier_replicas,
        "methods": methods, "unique_requests": len(specs),
        "faulty_phase_s": round(faulty_s, 1), "total_s": round(time.monotonic() - started, 1),
        **tally.counts, "errors": tally.errors[:10], "kills": chaos.kills,
        "restarts": {s.name: supervisor.restarts(s.name) for s in stack.services},
        "kv_blocks_leaked": leaked,
        "rss_kb": {n: {"start": rss_start[n], "end": rss_end[n]} for n in rss_start},
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python "
                   f"{platform.python_version()}",
    }


def report_md(r: dict) -> str:
    rows = "\n".join(
        f"| {name} | {v['start'] / 1024:.0f} | {v['end'] / 1024:.0f} | "
        f"{(v['end'] - v['start']) / 1024:+.0f} | {r['kills'].get(name, 0)} | "
        f"{r['restarts'].get(name, 0)} |" for name, v in r["rss_kb"].items())
    verdict = ("PASS" if r["failed"] == 0 and r["mismatched"] == 0
               and not any(r["kv_blocks_leaked"].values()) else "FAIL")
    return f"""# Soak ({r['mode']} mode): {verdict}

`python bench/soak.py` (`make soak`): {r['streams']} concurrent gRPC streams through the gateway
for {r['faulty_phase_s']} s, over {r['verifier_replicas']} verifier replicas and the
{', '.join(r['methods'])} proposer(s), while a proposer or a verifier replica was SIGKILLed at
random (the supervisor restarted it) and clients cancelled some requests at random. Workload:
{r['unique_requests']} distinct requests, greedy and seeded sampled, speculation on and off,
each checked against its output in an undisturbed run. Seed {r['seed']}; {r['machine']}.

| requests | count |
|---|---|
| completed | {r['completed']} |
| cancelled on purpose | {r['cancelled']} |
| failed | {r['failed']} |
| outputs checked against the reference | {r['checked']} |
| outputs that differ | {r['mismatched']} |

KV blocks leaked (total - free once idle, per verifier): {r['kv_blocks_leaked']}

| service | RSS start (MiB) | RSS end (MiB) | growth | SIGKILLs | restarts |
|---|---|---|---|---|---|
{rows}

A restarted service's RSS is that of its new process. Errors (first 10): {r['errors'] or 'none'}
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--short", action="store_true", help="the test suite's quick mode")
    ap.add_argument("--model", default=str(ROOT / DEFAULT_MODEL))
    ap.add_argument("--streams", type=int, default=None)
    ap.add_argument("--duration-s", type=float, default=None)
    ap.add_argument("--max-requests", type=int, default=None)
    ap.add_argument("--unique", type=int, default=None, help="distinct requests in the workload")
    ap.add_argument("--max-tokens", type=int, default=None)
    ap.add_argument("--kill-interval-s", type=float, default=None)
    ap.add_argument("--cancel-rate", type=float, default=0.1)
    ap.add_argument("--verifier-replicas", type=int, default=2)
    ap.add_argument("--draft", action=argparse.BooleanOptionalAction, default=None,
                    help="also run the draft-model proposer (default: long mode only)")
    ap.add_argument("--timeout-s", type=float, default=180.0, help="per request")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-dir", default=str(ROOT / "bench/out/soak-logs"))
    ap.add_argument("--json", default=None, help="write the summary here")
    ap.add_argument("--out", default=None,
                    help="markdown report (default: bench/reports/soak.md in long mode)")
    args = ap.parse_args(argv)
    quick = dict(streams=6, duration_s=15.0, max_requests=200, unique=8, max_tokens=48,
                 kill_interval_s=3.0, draft=False)
    full = dict(streams=12, duration_s=300.0, max_requests=5000, unique=40, max_tokens=96,
                kill_interval_s=8.0, draft=True)
    for key, value in (quick if args.short else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.out is None and not args.short:
        args.out = str(ROOT / "bench/reports/soak.md")
    result = soak(args)
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).write_text(report_md(result))
    ok = (result["failed"] == 0 and result["mismatched"] == 0
          and not any(result["kv_blocks_leaked"].values()))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
