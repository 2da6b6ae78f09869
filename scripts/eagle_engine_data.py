"""Self-distilled answers for the real model's EAGLE head, generated through the project's own
verifier engine (in-process, continuous batching of many greedy requests), saved as token ids in
resumable shards.

    python scripts/eagle_engine_data.py [--concurrency 64] [--max-tokens 256] [--minutes 60]
                                        [--specbench PATH/question.jsonl]

Requests: scripts/eagle_prompts.py's templates, minus every prompt that overlaps the held-out set
or any of Spec-Bench's 480 questions (the overlap report and the dropped prompts are kept in
data/eagle-real/manifest.json, so a rerun without the Spec-Bench file drops the same ones).

Each answer goes through the model's chat template as one user turn (exactly as
scripts/eagle_data.py answers the held-out prompts), greedy, speculation off, up to --max-tokens
tokens or the end of turn. A shard (data/eagle-real/answers/shard-NNNN.jsonl.gz, one JSON line
per answer: prompt, kind, category, prompt_ids, answer_ids, finish) is written atomically every
--shard answers and on a stop (SIGTERM, SIGINT, the wall-clock cap); a rerun skips every prompt
already in a shard and continues. progress.json keeps each shard's wall and CPU seconds (on a
shared machine the CPU time is the cost, the wall time depends on who else runs).

Features are not stored: the answers are greedy, so one batched teacher-forced forward of the
target over prompt + answer (scripts/eagle_features.py) gives the same features, top-k labels and
argmax a feature-keeping generation would (the argmax agreement is measured there).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gzip
import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import eagle_heldout  # noqa: E402
import eagle_prompts  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "data" / "eagle-real"
SPECBENCH = REPO / "runs" / "spec-bench-question.jsonl"  # git show of the fetched repository


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# -- shards (resume) -----------------------------------------------------------------------------

def shard_paths(data: Path) -> list[Path]:
    return sorted((data / "answers").glob("shard-*.jsonl.gz"))


def load_answers_of(shard: Path) -> list[dict]:
    with gzip.open(shard, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_answers(data: Path) -> list[dict]:
    """Every saved answer, shard by shard."""
    return [a for p in shard_paths(data) for a in load_answers_of(p)]


def write_shard(data: Path, answers: list[dict]) -> Path:
    """The next shard, written to a temporary name then renamed (a kill never leaves half a
    shard under a shard's name)."""
    d = data / "answers"
    d.mkdir(parents=True, exist_ok=True)
    existing = shard_paths(data)
    n = int(existing[-1].name.split("-")[1].split(".")[0]) + 1 if existing else 0
    path = d / f"shard-{n:04d}.jsonl.gz"
    tmp = path.with_suffix(".tmp")
    with gzip.open(tmp, "wt") as f:
        for a in answers:
            f.write(json.dumps(a, separators=(",", ":")) + "\n")
    os.replace(tmp, path)
    return path


def todo(prompts: list[dict], data: Path) -> list[dict]:
    """The prompts not answered yet, in their order (a prompt's text is its identity)."""
    done = {a["prompt"] for a in load_answers(data)}
    return [p for p in prompts if p["prompt"] not in done]


# -- the request list ----------------------------------------------------------------------------

def request_list(data: Path, specbench: Path | None, log=log) -> list[dict]:
    """The templated prompts minus those overlapping the held-out set or Spec-Bench; the overlap
    report is written to the manifest the first time the Spec-Bench file is seen, and its
    dropped prompts are dropped again on every later run (with or without the file)."""
    items = eagle_prompts.build_prompts()
    held = eagle_heldout.CHAT + eagle_heldout.CODE
    kept, drop_held = eagle_prompts.split_overlapping(items, held)
    man_path = data / "manifest.json"
    man = json.loads(man_path.read_text()) if man_path.exists() else {}
    if specbench is not None and specbench.exists():
        refs = eagle_prompts.specbench_texts(specbench)
        kept2, drop_sb = eagle_prompts.split_overlapping(kept, refs)
        man["specbench"] = {
            "source": "hemingkx/Spec-Bench data/spec_bench/question.jsonl (all questions)",
            "questions": sum(1 for line in specbench.read_text().splitlines() if line.strip()),
            "turns": len(refs), "word_ngram": eagle_prompts.ed.WORD_NGRAM,
            "prompts_checked": len(kept), "dropped": [d["prompt"] for d in drop_sb],
            "prompts_sharing_an_ngram": eagle_prompts.shared_ngram_counts(kept, refs)}
        kept = kept2
    elif "specbench" in man:
        gone = set(man["specbench"]["dropped"])
        kept = [k for k in kept if k["prompt"] not in gone]
    else:
        raise SystemExit("no Spec-Bench question file (--specbench) and no manifest recording "
                         "its overlap check: the requests cannot be checked against it")
    man.update({"templated_prompts": len(items), "heldout_dropped": len(drop_held),
                "requests": len(kept)})
    data.mkdir(parents=True, exist_ok=True)
    man_path.write_text(json.dumps(man, indent=1) + "\n")
    log(f"requests: {len(items)} templated, {len(drop_held)} overlap the held-out set, "
        f"{len(man.get('specbench', {}).get('dropped', []))} overlap Spec-Bench, "
        f"{len(kept)} kept")
    return kept


# -- generation ----------------------------------------------------------------------------------

async def generate(a, items: list[dict]) -> None:
    from splitspec.params import GenerationInput, SamplingParams, StoppingCriteria
    from verifier_service.config import VerifierConfig
    from verifier_service.server import build_engine

    config = dataclasses.replace(
        VerifierConfig(model=str(a.model), threads=a.threads),
        max_num_seqs=a.concurrency, kv_cache_memory_mb=a.kv_mb, warmup=False)
    engine, *_ = build_engine(config, {})
    engine.start()
    tok = engine.tokenizer
    end_turn = tok.convert_tokens_to_ids("<|im_end|>")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    deadline = time.time() + a.minutes * 60
    buffer: list[dict] = []
    shard_t0 = [time.time(), time.process_time()]
    queue = list(items)
    total = [0]

    def flush() -> None:
        if not buffer:
            return
        path = write_shard(a.data, buffer)
        secs = time.time() - shard_t0[0]
        toks = sum(len(b["answer_ids"]) for b in buffer)
        prog_path = a.data / "progress.json"
        prog = json.loads(prog_path.read_text()) if prog_path.exists() else {"shards": []}
        prog["shards"].append({"shard": path.name, "answers": len(buffer), "answer_tokens": toks,
                               "seconds": round(secs, 1),
                               "cpu_seconds": round(time.process_time() - shard_t0[1], 1),
                               "concurrency": a.concurrency,
                               "max_tokens": a.max_tokens, "threads": a.threads})
        prog_path.write_text(json.dumps(prog, indent=1) + "\n")
        total[0] += len(buffer)
        cpu = prog["shards"][-1]["cpu_seconds"]
        log(f"{path.name}: {len(buffer)} answers, {toks} tokens in {secs:.0f} s, {cpu:.0f} CPU s "
            f"({toks / secs:.1f} tokens/s; per 1,000 answers {secs / len(buffer) * 1000 / 60:.1f} "
            f"min, {cpu / len(buffer) * 1000 / 60:.1f} CPU min); {total[0]} this run")
        buffer.clear()
        shard_t0[:] = [time.time(), time.process_time()]

    async def worker(w: int) -> None:
        while queue and not stop.is_set() and time.time() < deadline:
            it = queue.pop(0)
            text = tok.apply_chat_template([{"role": "user", "content": it["prompt"]}],
                                           tokenize=False, add_generation_prompt=True)
            ids = tok(text, add_special_tokens=False).input_ids
            inp = GenerationInput(f"w{w}-{len(queue)}", tuple(ids), SamplingParams(temperature=0),
                                  StoppingCriteria(max_tokens=a.max_tokens))
            out, finish = [], None
            async for o in engine.generate(inp):
                out += o.token_ids
                finish = o.finish_reason
                if stop.is_set():
                    break
            if finish is None:
                return  # stopped mid-answer: not saved, answered again next run
            if finish == "stop" and (not out or out[-1] != end_turn):
                out.append(end_turn)  # the end of turn the engine stopped on
            buffer.append(dict(it, prompt_ids=ids, answer_ids=out, finish=finish))
            if len(buffer) >= a.shard:
                flush()

    try:
        await asyncio.gather(*(worker(w) for w in range(a.concurrency)))
    finally:
        flush()
        await engine.shutdown()
    why = "stopped" if stop.is_set() else "time cap" if time.time() >= deadline else "done"
    log(f"generation ended ({why}); {len(load_answers(a.data))} answers saved in all")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=REPO / "models/smollm2-135m-instruct")
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--specbench", type=Path, default=SPECBENCH,
                   help="Spec-Bench's question.jsonl (every question), for the overlap check")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--kv-mb", type=int, default=1200)
    p.add_argument("--shard", type=int, default=64, help="answers per saved shard")
    p.add_argument("--minutes", type=float, default=60)
    p.add_argument("--limit", type=int, default=0, help="answer at most this many (0: all)")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    import torch

    torch.set_num_threads(a.threads)
    items = todo(request_list(a.data, a.specbench), a.data)
    if a.limit:
        items = items[:a.limit]
    log(f"{len(items)} requests to answer (concurrency {a.concurrency}, up to {a.max_tokens} "
        f"tokens, {a.minutes} min cap)")
    if items:
        asyncio.run(generate(a, items))


if __name__ == "__main__":
    main()
