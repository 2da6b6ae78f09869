"""Tensor parallelism in tests (splitspec/tensor_parallel.py).

`ThreadRanks` runs N ranks as threads of this process over a stand-in for the group's
collectives (a barrier and the ranks' tensors summed in rank order): the sharded forward's
arithmetic without processes, for cheap tests of any N. `TPServe` is the real thing: a verifier
engine as rank 0 of a gloo group with rank 1 in a process of its own
(verifier_service/tp/worker.py), shared by a module's tests.

`tiny_family` makes a tiny random checkpoint of a lean family with the tiny Llama's tokenizer
(as tests/verifier_service/test_model_families.py does).
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import torch

TINY = dict(vocab_size=1024, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            max_position_embeddings=256, bos_token_id=0, eos_token_id=0, pad_token_id=None,
            tie_word_embeddings=False)


def tiny_family(model_type: str, out, **overrides) -> str:
    """A tiny random checkpoint of `model_type` (llama, mistral, qwen2) in `out`."""
    from tiny_proposer_models import TINY_TARGET, copy_tokenizer
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **{**TINY, **overrides})
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # random biases (Qwen2's q/k/v), so that sharding them is exercised
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
    model.save_pretrained(out)
    copy_tokenizer(TINY_TARGET, out)
    return str(out)


class _Exchange:
    def __init__(self, size: int):
        self.barrier = threading.Barrier(size, timeout=60)  # a rank that stopped early: no hang
        self.slots: list = [None] * size

    def __call__(self, rank: int, x: torch.Tensor) -> list[torch.Tensor]:
        self.slots[rank] = x
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()
        return out


class ThreadGroup:
    """A TPGroup stand-in for one thread-rank: the forward's collectives and the host
    broadcast, each counted."""

    def __init__(self, rank: int, size: int, exchange: _Exchange):
        self.rank, self.size, self.device = rank, size, torch.device("cpu")
        self.counts: Counter = Counter()
        self._exchange = exchange

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        self.counts["all_reduce"] += 1
        parts = self._exchange(self.rank, x.clone())
        total = parts[0].clone()
        for p in parts[1:]:
            total += p
        return x.copy_(total)

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        self.counts["all_gather"] += 1
        return torch.stack(self._exchange(self.rank, x.clone()))

    def broadcast(self, t: torch.Tensor) -> None:
        self.counts["broadcast"] += 1
        sent = self._exchange(self.rank, t.clone())[0]
        assert sent.shape == t.shape, f"rank {self.rank} expects {t.shape}, got {sent.shape}"
        t.copy_(sent)


class ThreadRanks:
    """N thread-ranks: run(fn) calls fn(rank, group) on each, concurrently; returns the results
    in rank order."""

    def __init__(self, size: int):
        exchange = _Exchange(size)
        self.groups = [ThreadGroup(r, size, exchange) for r in range(size)]
        self._pool = ThreadPoolExecutor(size)

    def run(self, fn) -> list:
        futures = [self._pool.submit(fn, r, g) for r, g in enumerate(self.groups)]
        errors = [f.exception(timeout=180) for f in futures]
        first = next((e for e in errors if not isinstance(e, (type(None),
                                                              threading.BrokenBarrierError))),
                     next((e for e in errors if e is not None), None))
        if first is not None:  # the rank that failed first, not the ones left waiting for it
            raise first
        return [f.result() for f in futures]


class TPServe:
    """A tensor-parallel verifier engine (rank 0, this process) over a gloo group with its other
    ranks in processes of their own; in-process proposers. close() stops the ranks."""

    def __init__(self, model_dir: str, proposers: dict | None = None, size: int = 2,
                 **overrides):
        from proposer_testlib import InProcessProposerClient

        from proposer_service.ngram import NgramProposer
        from verifier_service.config import VerifierConfig
        from verifier_service.server import build_engine
        from verifier_service.tp.worker import start_group

        config = VerifierConfig(model=model_dir, threads=1, tensor_parallel_size=size,
                                warmup=False, **overrides)
        self.exits: list[tuple[int, int | None]] = []
        self.group, self.ranks = start_group(config, lambda r, c: self.exits.append((r, c)))
        clients = {m: InProcessProposerClient(p)
                   for m, p in (proposers or {"ngram": NgramProposer()}).items()}
        self.engine = build_engine(config, clients, group=self.group)[0]
        self.loop = asyncio.new_event_loop()  # one loop for every run: the engine's own
        self.closed = False

    @property
    def broadcast(self):
        return self.engine.executor.broadcast

    def run(self, inputs):
        """Serve the requests together (one batch); each one's (tokens, text, last output)."""
        return self.loop.run_until_complete(serve_all(self.engine, inputs))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.engine.executor.broadcast.stop()
        except Exception:  # noqa: BLE001 - the group may be broken already (a killed rank)
            pass
        self.ranks.stop()
        self.group.close()
        self.loop.close()


async def serve_all(engine, inputs):
    """Like engine_testlib.run_all, but the engine stays usable afterwards (its model thread
    is kept): the loop task is started and cancelled."""
    from engine_testlib import collect

    engine.start()
    try:
        return await asyncio.gather(*(collect(engine, i) for i in inputs))
    finally:
        engine._task.cancel()
        await asyncio.gather(engine._task, return_exceptions=True)


def teacher_forced_argmax(engine, token_ids: list[int]) -> list[int]:
    """The target's argmax after every prefix of token_ids, in one step through the engine's
    executor (fed as the first token plus a chain of drafts: every row gets logits), on a
    table reserved and released around it."""
    from kernels.layout import StepLayout
    from verifier_service.kv.cache import BlockTable

    n = len(token_ids)
    kv, executor = engine.runner.kv, engine.executor
    table = BlockTable()
    kv.reserve(table, n)
    try:
        layout = StepLayout.build([n], [0], [n - 1], [True], None)

        def step():
            out = executor.execute(executor.plan(layout, token_ids, [table.blocks]))
            return executor.fetch([out.argmax])[0][0].tolist()

        return engine._executor.submit(step).result()  # on the model thread, as steps run
    finally:
        kv.release(table)


def serve_in_threads(model_dir: str, make_inputs, size: int = 2, **overrides):
    """A tensor-parallel verifier whose ranks are threads of this process (ThreadRanks): rank 0
    builds the engine and serves make_inputs(engine) (then tells the others to stop), the others
    follow it (verifier_service/tp/worker.follow). Returns (outputs, rank 0's engine, rank 0's
    group, the steps each other rank ran)."""
    from engine_testlib import run_all
    from proposer_testlib import InProcessProposerClient

    from proposer_service.ngram import NgramProposer
    from verifier_service.config import VerifierConfig
    from verifier_service.model.target import build_runner
    from verifier_service.server import build_engine
    from verifier_service.step.executor import StepExecutor
    from verifier_service.tp.broadcast import PlanReceiver
    from verifier_service.tp.worker import follow

    config = VerifierConfig(model=model_dir, threads=1, tensor_parallel_size=size,
                            warmup=False, **overrides)
    loading = threading.Lock()  # transformers' loading is not thread-safe (default dtype)

    def rank(r, group):
        if r == 0:
            with loading:
                engine = build_engine(config, {"ngram": InProcessProposerClient(
                    NgramProposer())}, group=group)[0]
            try:
                return asyncio.run(run_all(engine, make_inputs(engine))), engine, group
            finally:
                engine.executor.broadcast.stop()
        with loading:
            runner, _, _ = build_runner(config, group)
        return follow(PlanReceiver(group), runner.kv, StepExecutor.for_config(runner, config))

    results = ThreadRanks(size).run(rank)
    return (*results[0], results[1:])
