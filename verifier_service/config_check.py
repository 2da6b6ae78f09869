"""The verifier's start-up check of its own configuration: every default against every limit.

A configuration that passes serves every valid request: a default that a request may lean on (k,
lookahead's shape) is one the verifier's own limits accept, so no request is refused because of
the deployment's settings. One that does not pass is refused before the model loads, with one
line naming the flags (splitspec/lifecycle.py prints a StartupError that way)."""

from __future__ import annotations

from splitspec.errors import StartupError
from splitspec.params import (
    MAX_LOOKAHEAD_GUESSES,
    MAX_LOOKAHEAD_NGRAM,
    MAX_LOOKAHEAD_WINDOW,
    lookahead_window_nodes,
)
from verifier_service.config import VerifierConfig


def config_problems(c: VerifierConfig) -> list[str]:
    """What is inconsistent in `c`, one phrase per problem naming its flags (none: it serves)."""
    problems = []

    def at_least(flag: str, value: float, low: float) -> None:
        if value < low:
            problems.append(f"--{flag} {value} must be >= {low}")

    at_least("max-num-speculative-tokens", c.max_num_speculative_tokens, 1)
    at_least("default-num-speculative-tokens", c.default_num_speculative_tokens, 0)
    at_least("max-num-branches", c.max_num_branches, 1)
    at_least("max-num-seqs", c.max_num_seqs, 1)
    at_least("max-num-batched-tokens", c.max_num_batched_tokens, 0)
    at_least("max-waiting", c.max_waiting, 0)
    at_least("block-size", c.block_size, 1)
    at_least("num-kv-blocks", c.num_kv_blocks, 0)
    at_least("max-model-len", c.max_model_len, 0)
    at_least("proposer-timeout-ms", c.proposer_timeout_ms, 0)
    at_least("shutdown-grace-s", c.shutdown_grace_s, 0)
    if not 0.0 <= c.gpu_memory_utilization <= 1.0:
        problems.append(f"--gpu-memory-utilization {c.gpu_memory_utilization} must be in "
                        "[0, 1] (0: --kv-cache-memory-mb sizes the cache)")
    if c.num_kv_blocks == 0 and c.kv_cache_memory_mb < 1:
        problems.append(f"--kv-cache-memory-mb {c.kv_cache_memory_mb} must be >= 1 "
                        "(or set --num-kv-blocks)")
    if c.default_num_speculative_tokens > c.max_num_speculative_tokens:
        problems.append(f"--default-num-speculative-tokens {c.default_num_speculative_tokens} "
                        f"exceeds --max-num-speculative-tokens {c.max_num_speculative_tokens}")
    shape_ok = True
    for flag, value, low, high in (("lookahead-window", c.lookahead_window, 1,
                                    MAX_LOOKAHEAD_WINDOW),
                                   ("lookahead-ngram", c.lookahead_ngram, 2, MAX_LOOKAHEAD_NGRAM),
                                   ("lookahead-guesses", c.lookahead_guesses, 0,
                                    MAX_LOOKAHEAD_GUESSES)):
        if not low <= value <= high:  # the bounds a request's own shape has
            problems.append(f"--{flag} {value} must be in [{low}, {high}]")
            shape_ok = False
    nodes = lookahead_window_nodes(c.lookahead_window, c.lookahead_ngram)
    if shape_ok and nodes > c.max_num_speculative_tokens:
        problems.append(
            f"lookahead's default window --lookahead-window {c.lookahead_window} x "
            f"(--lookahead-ngram {c.lookahead_ngram} - 1) = {nodes} draft nodes exceeds "
            f"--max-num-speculative-tokens {c.max_num_speculative_tokens}")
    if c.quantization != "none" and c.linear not in ("auto", "int8-dot"):
        problems.append(f"--quantization {c.quantization} runs its own products: leave --linear "
                        f"at auto (not {c.linear})")
    if c.quantization != "none" and (c.tensor_parallel_size > 1 or c.tensor_parallel_nodes > 1):
        problems.append(f"--quantization {c.quantization} runs on one CPU process: "
                        "--tensor-parallel-size must be 1")
    return problems


def check_config(c: VerifierConfig) -> None:
    """StartupError, one line naming every problem, when `c` is inconsistent."""
    problems = config_problems(c)
    if problems:
        raise StartupError("inconsistent configuration: " + "; ".join(problems))
