"""`--speculative-config JSON` of `splitspec serve`: vLLM's keys read into the settings of the
stack's services. Pure: no files read, no process started (splitspec/launcher/serve.py does).

    method                      the methods served: its proposer process, or its in-target
                                method in the verifiers
    model                       that method's model (--draft-model, --mlp-model, --eagle-model)
    num_speculative_tokens      the verifiers' --max-num-speculative-tokens and
                                --default-num-speculative-tokens; the proposers'
                                --max-num-speculative-tokens
    prompt_lookup_max / _min    the ngram proposer's --ngram-max / --ngram-min
    draft_tensor_parallel_size  the draft proposer's --tensor-parallel-size
    disable_by_batch_size       the gateway's --speculative-disable-queue-size

Any other key, or a value of the wrong kind, is refused with a message naming it.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any

from splitspec.methods import (
    METHODS,
    Kind,
    components_of,
    hybrid_components,
    hybrid_error,
)
from splitspec.params import lookahead_window_nodes

# vLLM's method names -> the registry's (splitspec/methods.py); the registry's own names and
# hybrids of them ("hybrid:suffix|ngram") are taken as they are.
VLLM_METHODS = {"ngram": "ngram", "draft_model": "draft", "mlp_speculator": "mlp",
                "eagle": "eagle", "eagle3": "eagle", "suffix": "suffix"}
# vLLM methods with no counterpart here (said so, rather than "unknown")
NOT_SERVED = ("medusa", "mtp", "deepseek_mtp", "ernie_mtp", "qwen3_next_mtp", "mimo_mtp",
              "longcat_flash_mtp", "glm4_moe_mtp")
KEYS = ("method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min",
        "draft_tensor_parallel_size", "disable_by_batch_size")
# The verifier's default lookahead shape (--lookahead-window, --lookahead-ngram): its window,
# W x (N - 1) draft nodes, must fit --max-num-speculative-tokens, so a smaller k narrows it.
LOOKAHEAD_WINDOW, LOOKAHEAD_NGRAM = 3, 3


class SpeculativeConfigError(ValueError):
    """A --speculative-config that cannot be served; the message names the key."""


@dataclass(frozen=True)
class SpeculativeSettings:
    """What a --speculative-config asks of the stack."""

    methods: tuple[str, ...]  # registry methods to serve (a hybrid's components)
    model: str | None = None  # the one model-backed method's directory
    num_speculative_tokens: int | None = None
    ngram_min: int | None = None
    ngram_max: int | None = None
    draft_tensor_parallel_size: int | None = None
    disable_queue_size: int | None = None

    @property
    def model_method(self) -> str | None:
        """The model-backed method `model` belongs to (None: the methods need none)."""
        backed = [m for m in self.methods if METHODS[m].capabilities.needs_model]
        return backed[0] if len(backed) == 1 else None

    def verifier_args(self) -> list[str]:
        k = self.num_speculative_tokens
        if k is None:
            return []
        args = ["--max-num-speculative-tokens", str(k), "--default-num-speculative-tokens", str(k)]
        return args + lookahead_fitting(k)

    def gateway_args(self) -> list[str]:
        if self.disable_queue_size is None:
            return []
        return ["--speculative-disable-queue-size", str(self.disable_queue_size)]

    def proposer_args(self, method: str) -> list[str]:
        """Flags for the proposer of `method` (one of self.methods)."""
        args = []
        if self.num_speculative_tokens is not None:
            args += ["--max-num-speculative-tokens", str(self.num_speculative_tokens)]
        if method == "ngram":
            args += [*(["--ngram-min", str(self.ngram_min)] if self.ngram_min else []),
                     *(["--ngram-max", str(self.ngram_max)] if self.ngram_max else [])]
        if method == "draft" and self.draft_tensor_parallel_size:
            args += ["--tensor-parallel-size", str(self.draft_tensor_parallel_size)]
        return args


def lookahead_fitting(k: int) -> list[str]:
    """Verifier flags that narrow lookahead's default window to at most k draft nodes (none
    when the default fits): the verifier serves lookahead whatever else runs, and refuses to
    start with a default window wider than its largest k."""
    if lookahead_window_nodes(LOOKAHEAD_WINDOW, LOOKAHEAD_NGRAM) <= k:
        return []
    ngram = min(LOOKAHEAD_NGRAM, k + 1)
    window = max(1, min(LOOKAHEAD_WINDOW, k // (ngram - 1)))
    return ["--lookahead-window", str(window), "--lookahead-ngram", str(ngram)]


def _method(value: Any) -> tuple[str, ...]:
    if not isinstance(value, str) or not value:
        raise SpeculativeConfigError(f"'method' must be a method name, got {value!r}")
    if value in VLLM_METHODS:
        return (VLLM_METHODS[value],)
    if value in METHODS:
        return (value,)
    if hybrid_components(value) is not None:
        problem = hybrid_error(value)
        if problem:
            raise SpeculativeConfigError(f"'method': {problem}")
        return components_of(value)
    known = sorted({*VLLM_METHODS, *METHODS})
    if value in NOT_SERVED:
        raise SpeculativeConfigError(f"'method': {value!r} is not available in splitspec; "
                                     f"available: {', '.join(known)} or hybrid:A+B")
    raise SpeculativeConfigError(f"'method': unknown method {value!r}; known: "
                                 f"{', '.join(known)} or hybrid:A+B")


def _count(config: dict[str, Any], key: str) -> int | None:
    value = config.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpeculativeConfigError(f"'{key}' must be an integer >= 1, got {value!r}")
    return value


def parse_speculative_config(text: str) -> SpeculativeSettings:
    """The settings a --speculative-config JSON object asks for; SpeculativeConfigError names
    the first key that cannot be served."""
    try:
        config = json.loads(text)
    except ValueError as exc:
        raise SpeculativeConfigError(f"not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise SpeculativeConfigError(f"must be a JSON object, got {shlex.quote(text)}")
    unknown = [key for key in config if key not in KEYS]
    if unknown:
        raise SpeculativeConfigError(f"unknown key {unknown[0]!r}; splitspec reads "
                                     f"{', '.join(KEYS)}")
    if "method" not in config:
        raise SpeculativeConfigError("'method' is required, e.g. {\"method\": \"ngram\"}")
    methods = _method(config["method"])
    model = config.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise SpeculativeConfigError(f"'model' must be a model directory, got {model!r}")
    backed = [m for m in methods if METHODS[m].capabilities.needs_model]
    if model is not None and len(backed) != 1:
        raise SpeculativeConfigError(
            f"'model': method {config['method']!r} " + (
                "loads no model" if not backed else
                f"has several model-backed parts ({', '.join(backed)}); give each its "
                "--METHOD-model flag instead"))
    k = _count(config, "num_speculative_tokens")
    low, high = _count(config, "prompt_lookup_min"), _count(config, "prompt_lookup_max")
    if (low or high) and "ngram" not in methods:
        key = "prompt_lookup_min" if low else "prompt_lookup_max"
        raise SpeculativeConfigError(f"'{key}' sets the ngram method's match lengths; method "
                                     f"{config['method']!r} has no ngram")
    if low or high:  # one given: the other is the same (vLLM's reading)
        low, high = low or high, high or low
        if low > high:
            raise SpeculativeConfigError(f"'prompt_lookup_min' {low} exceeds "
                                         f"'prompt_lookup_max' {high}")
    draft_tp = _count(config, "draft_tensor_parallel_size")
    if draft_tp and draft_tp > 1 and "draft" not in methods:
        raise SpeculativeConfigError(
            "'draft_tensor_parallel_size' splits a draft model over devices; method "
            f"{config['method']!r} has none" + (
                " (an in-target method runs on the verifier's devices)"
                if any(METHODS[m].kind is Kind.IN_TARGET for m in methods) else ""))
    return SpeculativeSettings(methods, model, k, low, high, draft_tp,
                               _count(config, "disable_by_batch_size"))
