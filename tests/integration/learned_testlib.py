"""Helpers for the learned-proposer integration tests: a sharpened copy of the tiny target with a
draft and an MLP speculator that fit it, a Stack running them, and a gRPC client that returns
token ids and usage."""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
from testdata import PROMPTS  # noqa: F401 - re-exported for the learned-proposer tests
from tiny_proposer_models import make_models, make_sharp_target  # noqa: F401 - re-exported

from protos import common_pb2, generation_pb2_grpc
from splitspec.launcher import Stack, StackConfig


def learned_stack_config(target: str, draft: str | None, spec: str | None, log_dir: Path,
                         timeout_ms: float = 5000.0, eagle: str | None = None,
                         **kwargs) -> StackConfig:
    """One torch thread per process; a generous per-step deadline (2 shared cores), so that
    acceptance does not depend on the machine's load."""
    verifier_args = ["--threads", "1", "--proposer-timeout-ms", str(timeout_ms),
                     "--proposer-reconnect-s", "0.5", *kwargs.pop("verifier_args", [])]
    return StackConfig.with_free_ports(
        model=target, device="cpu", log_dir=log_dir, verifier_args=verifier_args,
        models={"draft": draft, "mlp": spec, **({"eagle": eagle} if eagle else {})},
        proposer_args={"draft": ["--threads", "1"], "mlp": ["--threads", "1"]}, **kwargs)


@dataclass
class Result:
    token_ids: list[int]
    text: str
    finish_reason: int
    usage: common_pb2.Usage


class GenClient:
    """The public gRPC Generation API, token ids in and out."""

    def __init__(self, port: int):
        self._channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = generation_pb2_grpc.GenerationStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    @staticmethod
    def request(prompt: str, method: str | None = None, k: int = 4, max_tokens: int = 16,
                temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None,
                ignore_eos: bool = True, branches: int = 1) -> common_pb2.GenerateRequest:
        spec = (common_pb2.SpeculationConfig(mode=common_pb2.SPECULATION_MODE_OFF)
                if method is None else
                common_pb2.SpeculationConfig(mode=common_pb2.SPECULATION_MODE_ON, method=method,
                                             num_speculative_tokens=k))
        if method is not None and branches > 1:
            spec.num_branches = branches  # token trees: up to `branches` children per node
        sampling = common_pb2.SamplingParams(temperature=temperature, top_p=top_p)
        if seed is not None:
            sampling.seed = seed
        return common_pb2.GenerateRequest(
            text=prompt, sampling=sampling, speculation=spec,
            stopping=common_pb2.StoppingCriteria(max_tokens=max_tokens, ignore_eos=ignore_eos))

    def generate(self, req: common_pb2.GenerateRequest, timeout: float = 120.0,
                 on_chunk=None) -> Result:
        ids, text, finish, usage = [], "", 0, None
        for chunk in self.stub.Generate(req, timeout=timeout):
            ids += chunk.token_ids
            text += chunk.text
            finish = chunk.finish_reason or finish
            if chunk.HasField("usage"):
                usage = chunk.usage
            if on_chunk is not None:
                on_chunk(len(ids))
        return Result(ids, text, finish, usage)

    def generate_all(self, reqs: list[common_pb2.GenerateRequest], workers: int = 8
                     ) -> list[Result]:
        """Concurrently, so that the verifier batches them into shared steps."""
        with ThreadPoolExecutor(workers) as pool:
            return list(pool.map(self.generate, reqs))


@contextlib.contextmanager
def gen_client(stack: Stack):
    client = GenClient(stack.config.grpc_port)
    try:
        yield client
    finally:
        client.close()
