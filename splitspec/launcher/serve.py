"""`splitspec serve MODEL`: the stack `splitspec up` starts, under the flag names of `vllm serve`
(--port, --served-model-name, --api-key, --dtype, --max-model-len, -tp, --max-num-seqs,
--speculative-config, ...). Each of those flags becomes a flag of the service that owns the
setting (up_namespace), so a `serve` command line is one `up` command line; what has no
counterpart is not accepted (docs/vllm-flags.md says which and why). splitspec's own switches
(replicas, TLS, proposer ports and per-service flags) are `up`'s, taken as they are.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import tempfile
from pathlib import Path

from splitspec import speculators_format
from splitspec.launcher import up
from splitspec.launcher.config import sibling_proposer_models
from splitspec.launcher.speculative_config import (
    SpeculativeConfigError,
    SpeculativeSettings,
    parse_speculative_config,
)
from splitspec.methods import METHODS, in_target_methods, proposer_methods

API_KEY_ENV = "SPLITSPEC_API_KEY"  # as vLLM reads VLLM_API_KEY
# vLLM's --dtype spellings -> the services' (half and float are vLLM's aliases)
DTYPES = {"auto": "auto", "float16": "float16", "half": "float16", "bfloat16": "bfloat16",
          "float32": "float32", "float": "float32"}
# The verifier's defaults for the flags `serve` passes only when given (verifier_service/
# config.py; a test holds them equal)
VERIFIER_DEFAULTS = {"max_num_seqs": 8, "max_num_batched_tokens": 2048, "block_size": 16,
                     "gpu_memory_utilization": 0.0, "kv_cache_memory_mb": 512}

DESCRIPTION = """\
Serve MODEL with speculative decoding: the gateway (OpenAI-compatible REST on --host:--port),
the verifier and the proposers, each its own process on this machine, as `vllm serve MODEL`
would take them:

    splitspec serve models/target --speculative-config '{"method": "ngram", \
"num_speculative_tokens": 5}'

Without --speculative-config every method that fits MODEL is served and the gateway picks one
(or none) per request. With it, only the method it names (and lookahead decoding, which every
verifier runs itself). `splitspec up` is the same stack with every switch spelled out.
"""


def add_command(commands: argparse._SubParsersAction) -> None:
    """Register `serve`: vLLM's flags, then splitspec's own (`up`'s)."""
    serve = commands.add_parser("serve", help="serve a model as `vllm serve` does: gateway + "
                                "verifier + proposers locally", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    serve.add_argument("model", metavar="MODEL",
                       help="the target model: a local directory in Hugging Face format "
                       "(a GGUF file: `splitspec import-gguf` first)")
    v = serve.add_argument_group("vLLM's flags")
    v.add_argument("--host", default="127.0.0.1",
                   help="address every service listens on; 0.0.0.0 opens the front door to "
                   "the network (default: %(default)s)")
    v.add_argument("--port", type=int, default=8000,
                   help="the gateway's REST (OpenAI-compatible) port (default: %(default)s)")
    v.add_argument("--served-model-name", metavar="NAME", default=None,
                   help="the model id clients send and /v1/models lists "
                   "(default: MODEL's directory name)")
    v.add_argument("--api-key", metavar="KEY", action="append", default=None,
                   help="requests must send this key as a Bearer token; repeatable (default: "
                   f"${API_KEY_ENV} when set, else none: no key needed)")
    v.add_argument("--dtype", choices=tuple(DTYPES), default=None,
                   help="weights' and activations' dtype of the target and of a draft or MLP "
                   "speculator (default: auto, float32 on a CPU and bfloat16 on an "
                   "accelerator)")
    v.add_argument("--max-model-len", type=int, default=None,
                   help="context length limit (default: the model's own)")
    v.add_argument("--tensor-parallel-size", "-tp", type=int, default=1,
                   help="devices the target is split over (one process per device) "
                   "(default: %(default)s)")
    v.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="on an accelerator, the share of its memory the verifier uses, the KV "
                   "cache taking what is left after the weights (default: "
                   f"{VERIFIER_DEFAULTS['gpu_memory_utilization']:g}: the KV cache is sized by "
                   "the verifier's --kv-cache-memory-mb, "
                   f"{VERIFIER_DEFAULTS['kv_cache_memory_mb']} MB)")
    v.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                   default=True, help="reuse the KV of prompt prefixes computed before, in the "
                   "verifiers and the draft proposer (default: on)")
    v.add_argument("--seed", type=int, default=None,
                   help="seed of the random generator unseeded sampled requests draw from, in "
                   "every verifier (default: not seeded; a request's own seed needs none)")
    v.add_argument("--quantization", "-q", choices=("int8",), default=None,
                   help="the verifiers' target on int8 weights (weight-only, one scale per "
                   "output column; CPU, float32; default: the checkpoint's weights)")
    v.add_argument("--enforce-eager", action="store_true",
                   help="run every step eagerly, capturing no CUDA (or MLU) graphs "
                   "(default: off)")
    v.add_argument("--max-num-seqs", type=int, default=None,
                   help="sequences each verifier decodes together "
                   f"(default: {VERIFIER_DEFAULTS['max_num_seqs']})")
    v.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="tokens per step of each verifier; longer prompts are prefilled in "
                   f"chunks; 0: no limit (default: {VERIFIER_DEFAULTS['max_num_batched_tokens']})")
    v.add_argument("--block-size", type=int, default=None,
                   help=f"tokens per KV cache block (default: {VERIFIER_DEFAULTS['block_size']})")
    v.add_argument("--trust-remote-code", action="store_true",
                   help="allow model code shipped in the model directory, for the target and a "
                   "draft or MLP speculator (default: off)")
    v.add_argument("--speculative-config", metavar="JSON", type=_speculative_config,
                   default=None,
                   help="vLLM's speculative decoding settings as a JSON object: method "
                   "(ngram, draft_model, eagle, eagle3, suffix, mlp_speculator, or splitspec's "
                   f"{', '.join(METHODS)}, hybrid:A+B), model, num_speculative_tokens, "
                   "prompt_lookup_max, prompt_lookup_min, draft_tensor_parallel_size, "
                   "disable_by_batch_size (default: none: every method that fits MODEL, "
                   "chosen per request)")
    v.add_argument("--chat-template", metavar="PATH", default=None,
                   help="the verifier's chat template: a Jinja file, or a shipped one by name "
                   "(chatml_tools) (default: the model's own)")
    v.add_argument("--enable-auto-tool-choice", action="store_true",
                   help="serve tool_choice auto: the gateway reads calls out of the output with "
                   "--tool-call-parser (default: off)")
    v.add_argument("--tool-call-parser", metavar="NAME", default=None,
                   help="the model's tool-call format (hermes) (default: hermes)")
    own = serve.add_argument_group("splitspec's own flags")
    up.add_stack_arguments(own, methods_default=None,
                           methods_note=", unless --speculative-config names other methods")
    serve.set_defaults(run=lambda args: run(args, serve))


def _speculative_config(text: str) -> SpeculativeSettings:
    try:
        return parse_speculative_config(text)
    except SpeculativeConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _joined(mapped: list[str], given: str) -> str:
    """Flags mapped from vLLM's, then the ones given by hand (the last one given wins)."""
    return " ".join(filter(None, [shlex.join(mapped), given]))


def head_tokens(spec: SpeculativeSettings | None) -> SpeculativeSettings | None:
    """vLLM's default num_speculative_tokens for an EAGLE head in the speculators format: the
    speculative_tokens of the default proposal method its config.json names (the settings as
    they are when num_speculative_tokens is given, or the model is not such a head)."""
    if spec is None or spec.num_speculative_tokens is not None or not spec.model \
            or spec.model_method != "eagle":
        return spec
    try:
        cfg = json.loads((Path(spec.model) / "config.json").read_text())
    except (OSError, ValueError):
        return spec  # the verifier says what is wrong with the directory
    k = (speculators_format.speculative_tokens(cfg) if isinstance(cfg, dict)
         and speculators_format.is_speculators(cfg) else None)
    return spec if k is None else dataclasses.replace(spec, num_speculative_tokens=k)


def up_namespace(args: argparse.Namespace, api_key_file: str | None = None,
                 found: dict[str, str] | None = None) -> argparse.Namespace:
    """The `splitspec up` flags this `serve` command line stands for. ValueError: flags that
    contradict each other, or a method with no model. `found`: model-backed methods' directories
    next to the target (default: looked up)."""
    spec = head_tokens(args.speculative_config)
    ns = argparse.Namespace(**vars(args))
    ns.http_port = args.port
    verifier, gateway = [], []
    per_method: dict[str, list[str]] = {m: [] for m in proposer_methods()}
    if args.served_model_name:
        verifier += ["--served-model-name", args.served_model_name]
    model_args = [*(["--dtype", DTYPES[args.dtype]] if args.dtype else []),
                  *(["--trust-remote-code"] if args.trust_remote_code else [])]
    verifier += model_args  # and every proposer with a model of its own
    for m, method in proposer_methods().items():
        if method.capabilities.needs_model:
            per_method[m] += model_args
    if args.max_model_len is not None:
        verifier += ["--max-model-len", str(args.max_model_len)]
    if args.gpu_memory_utilization is not None:
        verifier += ["--gpu-memory-utilization", str(args.gpu_memory_utilization)]
    if args.enforce_eager:
        verifier += ["--graphs", "off"]
    if args.seed is not None:
        verifier += ["--seed", str(args.seed)]
    if args.quantization:
        verifier += ["--quantization", args.quantization]
    for flag in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
        if getattr(args, flag) is not None:
            verifier += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    if api_key_file:
        gateway += ["--api-key-file", api_key_file]
    if args.chat_template:
        verifier += ["--chat-template", args.chat_template]
    if args.enable_auto_tool_choice:
        gateway += ["--enable-auto-tool-choice"]
    if args.tool_call_parser:
        gateway += ["--tool-call-parser", args.tool_call_parser]
    if spec is not None:
        verifier += spec.verifier_args()
        gateway += spec.gateway_args()
        for m in spec.methods:
            if m in per_method:
                per_method[m] += spec.proposer_args(m)
    switchable = [*proposer_methods(), *(m for m, s in in_target_methods().items()
                                         if s.capabilities.needs_model)]
    for name in switchable:
        opt = name.replace("-", "_")
        given = getattr(args, opt)
        if given is False and spec is not None and name in spec.methods:
            raise ValueError(f"--no-{name} turns off the method --speculative-config names")
        setattr(ns, opt, (spec is None or name in spec.methods) if given is None else given)
    if spec is not None and spec.model:
        opt = spec.model_method.replace("-", "_")
        if getattr(args, f"{opt}_model") not in (None, spec.model):
            raise ValueError(f"--{spec.model_method}-model and --speculative-config's 'model' "
                             "name different directories; give it once")
        setattr(ns, f"{opt}_model", spec.model)
    if spec is not None:
        found = sibling_proposer_models(args.model) if found is None else found
        for m in spec.methods:
            if METHODS[m].capabilities.needs_model and not (
                    getattr(ns, f"{m.replace('-', '_')}_model") or found.get(m)):
                raise ValueError(
                    f"--speculative-config: method {m!r} needs its 'model' (none of "
                    f"{Path(args.model).name}-{METHODS[m].model_dir}/ or "
                    f"{METHODS[m].model_dir}/ next to {args.model} fits it)")
    ns.verifier_args = _joined(verifier, args.verifier_args)
    ns.gateway_args = _joined(gateway, args.gateway_args)
    for m, mapped in per_method.items():
        opt = m.replace("-", "_")
        setattr(ns, f"{opt}_args", _joined(mapped, getattr(args, f"{opt}_args")))
    return ns


def api_keys(args: argparse.Namespace, environ: dict[str, str] | None = None) -> list[str]:
    """The keys requests must send: --api-key's, else $SPLITSPEC_API_KEY's (none: no keys).
    ValueError for one the gateway's key file cannot hold."""
    env = os.environ if environ is None else environ
    keys = args.api_key or ([env[API_KEY_ENV]] if env.get(API_KEY_ENV) else [])
    for key in keys:
        if not key.strip() or key != key.strip() or any(c.isspace() for c in key) \
                or key.startswith("#"):
            raise ValueError("--api-key: a key is one word, not starting with '#'")
    return keys


def write_key_file(keys: list[str]) -> str:
    """A temporary file only this user can read, one key a line, for the gateway's
    --api-key-file: the keys stay out of the services' command lines."""
    fd, path = tempfile.mkstemp(prefix="splitspec-api-keys-")  # mode 0600
    with os.fdopen(fd, "w") as f:
        f.write("".join(f"{k}\n" for k in keys))
    return path


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Start the stack these flags describe (up.run) and remove the key file on exit."""
    try:
        keys = api_keys(args)
    except ValueError as exc:
        parser.error(str(exc))
    key_file = write_key_file(keys) if keys else None
    try:
        try:
            ns = up_namespace(args, key_file)
        except ValueError as exc:
            parser.error(str(exc))
        up.run(ns, parser)
    finally:
        if key_file:
            Path(key_file).unlink(missing_ok=True)
