"""`splitspec up`: the whole stack on this machine, proposer(s), verifier(s) and gateway as
separate processes, every switch of the local launcher spelled out (`splitspec serve` is the
same stack under vLLM's flag names, splitspec/launcher/serve.py). The flags both take are
registered by add_stack_arguments; stack_config turns them into the StackConfig that
splitspec/launcher/stack.py starts, and run supervises it until SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from splitspec.launcher.config import ProposerLaunch, StackConfig, sibling_proposer_models
from splitspec.launcher.stack import Stack
from splitspec.methods import in_target_methods, proposer_methods

if TYPE_CHECKING:  # cryptography is imported only where certificates are made
    from splitspec.tls_certs import StackCertificates

DESCRIPTION = """\
Start the whole stack on this machine: the proposers, the verifier(s) and the gateway, each as
its own process.

    splitspec up [--model DIR] [--http-port 8000] [--no-draft] [--no-mlp]
                 [--verifier-replicas N] [--tensor-parallel-size N]
                 [--verifier-args '--max-waiting 64'] ...

(`splitspec serve MODEL` starts the same stack under vLLM's flag names.)

Proposers: one process per method. Methods without a model (ngram, suffix) always run; a
model-backed one (draft, mlp) runs when its model is given (--draft-model, --mlp-model) or found
next to the target as TARGET-draft/ or draft/ (TARGET-mlp-speculator/ or mlp-speculator/) and
fits it (the same tokenizer file; a speculator with the target's hidden and vocabulary sizes).
The verifiers serve lookahead decoding themselves, and an EAGLE head found the same way
(TARGET-eagle/ or eagle/, or --eagle-model). --no-METHOD leaves a method out.

--tls runs every hop with mutual TLS and the front doors with HTTPS: a throwaway CA and a
certificate per role are written into a temporary directory (removed on exit); clients trust
the printed ca.pem.

--verifier-replicas N starts N verifiers behind the one gateway, sharing the proposers: the
first on --verifier-port, the others on the next ports no other service has. A port given to two
services is refused. --tensor-parallel-size N splits each verifier's model over N devices.

Any flag of a service passes through: --gateway-args, --verifier-args, --proposer-args (every
proposer) and --METHOD-args (one proposer) each take a quoted list of flags (the services'
own --help lists them).

Threads: each service gets OMP_NUM_THREADS from the cores this process may use: every verifier
an equal share of them (replicas and tensor-parallel ranks split them), a proposer with a model
a quarter (at least 1), the gateway and the n-gram and suffix proposers 1. A service's own
--threads (e.g. --verifier-args '--threads 2') wins; an OMP_NUM_THREADS already set here is kept
for every service.

Prints the gateway's URL once every service is healthy, restarts a service that exits (with
backoff) while the others keep serving, and stops them all on Ctrl-C or SIGTERM.
"""

# What --gateway-args, --verifier-args and --proposer-args pass, e.g. (flags each service takes)
EXAMPLE_ARGS = {"gateway": "--max-pending 256 --max-prompts 4",
                "verifier": "--max-waiting 64 --max-num-seqs 16",
                "proposer": "--max-batch 16 --idle-timeout-s 300"}


def add_command(commands: argparse._SubParsersAction) -> None:
    """Register `up` and its flags (one set per method of the registry)."""
    up = commands.add_parser("up", help="serve gateway + verifier + proposers locally, every "
                             "switch spelled out", description=DESCRIPTION,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    d = StackConfig()
    up.add_argument("--model", default=d.model,
                    help="target model directory (default: %(default)s)")
    up.add_argument("--host", default=d.host,
                    help="address every service listens on (default: %(default)s)")
    up.add_argument("--http-port", type=int, default=d.http_port,
                    help="the gateway's REST (OpenAI-compatible) port (default: %(default)s)")
    up.add_argument("--tensor-parallel-size", type=int, default=d.tensor_parallel_size,
                    help="devices each verifier splits the target over (it starts one process "
                    "per device; docs/deploy.md: replicas or tensor parallelism) "
                    "(default: %(default)s)")
    up.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                    default=True, help="reuse the KV of prompt prefixes computed before, in "
                    "the verifiers and the draft proposer (default: on)")
    add_stack_arguments(up)
    up.set_defaults(run=lambda args: run(args, up))


def add_stack_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                        methods_default: bool | None = True,
                        methods_note: str = "") -> None:
    """The flags `up` and `serve` share. methods_default None: the --METHOD switches default
    to None and the caller decides (`serve` from its --speculative-config); methods_note says
    how, in their help."""
    d = StackConfig()
    parser.add_argument("--grpc-port", type=int, default=d.grpc_port,
                        help="the gateway's public gRPC port (default: %(default)s)")
    parser.add_argument("--verifier-port", type=int, default=d.verifier_port,
                        help="the first verifier's port; further replicas take the next ports "
                        "that no other service has (default: %(default)s)")
    parser.add_argument("--verifier-replicas", type=int, default=d.verifier_replicas,
                        help="verifiers behind the gateway, sharing the proposers "
                        "(default: %(default)s)")
    for service in ("gateway", "verifier", "proposer"):
        which = "the" if service == "gateway" else "every"
        parser.add_argument(f"--{service}-args", default="",
                            help=f"flags passed to {which} {service}, quoted, e.g. "
                            f"'{EXAMPLE_ARGS[service]}' (default: none)")
    parser.add_argument("--resume-wait-s", type=float, default=30.0,
                        help="how long the gateway lets a stream whose verifier died wait for "
                        "one to serve again (it is restarted) (default: %(default)s)")
    parser.add_argument("--prefix-routing", action=argparse.BooleanOptionalAction, default=True,
                        help="the gateway sends a request to the verifier replica recently sent "
                        "its longest prompt prefix (off: least requests in flight) "
                        "(default: on)")
    parser.add_argument("--device", default=d.device,
                        help="cpu | cuda | mlu | auto, for every service (default: %(default)s)")
    parser.add_argument("--tls", action="store_true",
                        help="mutual TLS on every hop and HTTPS at the front door, with a "
                        "throwaway CA and certificates in a temporary directory (default: off)")
    parser.add_argument("--log-dir", type=Path, default=None,
                        help="write each service's log here (default: this terminal)")
    parser.add_argument("--metrics-port", type=int, default=d.metrics_port,
                        help="Prometheus /metrics of the gateway; the verifier and proposers get "
                        "the next ports; 0: off (default: %(default)s)")
    on = "on" if methods_default else f"on{methods_note}"
    for name, spec in proposer_methods().items():  # per proposer: on/off, port, model, device
        parser.add_argument(
            f"--{name}", action=argparse.BooleanOptionalAction, default=methods_default,
            help=f"run the {name} proposer ({spec.summary})"
            + (" when its model is found" if spec.capabilities.needs_model else "")
            + f" (default: {on})")
        parser.add_argument(f"--{name}-port", type=int, default=spec.default_port,
                            help=f"the {name} proposer's port (default: %(default)s)")
        parser.add_argument(f"--{name}-args", default="",
                            help=f"flags passed to the {name} proposer, after --proposer-args "
                            "(default: none)")
        if spec.capabilities.needs_model:
            parser.add_argument(f"--{name}-model", default=None,
                                help=f"its model directory (default: TARGET-{spec.model_dir}/, "
                                f"else {spec.model_dir}/ next to the target, if it fits)")
            parser.add_argument(f"--{name}-device", default=None,
                                help="its device (default: --device)")
    for name, spec in in_target_methods().items():  # in-target methods backed by a model
        if spec.capabilities.needs_model:
            parser.add_argument(
                f"--{name}", action=argparse.BooleanOptionalAction, default=methods_default,
                help=f"serve {name} in the verifiers ({spec.summary}) when its model is found "
                f"(default: {on})")
            parser.add_argument(f"--{name}-model", default=None,
                                help=f"its model directory (default: TARGET-{spec.model_dir}/, "
                                f"else {spec.model_dir}/ next to the target, if it fits)")


def serving_banner(args: argparse.Namespace, stack: Stack) -> str:
    """What the launcher prints once every service is SERVING (docs/getting-started.md shows it;
    tests/docs/test_docs_examples.py checks the docs against it)."""
    return (f"splitspec is serving {args.model} (proposers: {', '.join(stack.proposers)}; "
            f"verifier replicas: {len(stack.verifiers)}"
            + (f", each over {args.tensor_parallel_size} tensor-parallel ranks"
               if args.tensor_parallel_size > 1 else "") + ")\n"
            f"  REST (OpenAI-compatible): {stack.url}\n"
            f"  gRPC (splitspec.v1.Generation): {args.host}:{args.grpc_port}\n"
            + "".join(f"  metrics of {name}: {url}\n"
                      for name, url in stack.metrics_urls.items())
            + (f"  TLS: mutual TLS on every hop; clients trust {stack.config.tls.ca} (and may "
               f"present {stack.config.tls['client'].cert} / .key); removed on exit\n"
               if stack.config.tls else "")
            + "Ctrl-C stops everything.")


def stack_config(args: argparse.Namespace, tls: StackCertificates | None = None) -> StackConfig:
    """The stack `up` starts for these flags (model-backed methods found next to the target)."""
    found = sibling_proposer_models(args.model)
    caching = [] if args.enable_prefix_caching else ["--no-enable-prefix-caching"]
    launches = {}
    for name, spec in proposer_methods().items():
        opt = name.replace("-", "_")
        if not getattr(args, opt):
            continue
        model = (getattr(args, f"{opt}_model") or found.get(name)
                 if spec.capabilities.needs_model else None)
        device = getattr(args, f"{opt}_device", None)
        launches[name] = ProposerLaunch(getattr(args, f"{opt}_port"), model,
                                        [*(["--device", device] if device else []),
                                         *caching, *shlex.split(args.proposer_args),
                                         *shlex.split(getattr(args, f"{opt}_args"))])
    in_target = {}
    for name, spec in in_target_methods().items():
        opt = name.replace("-", "_")
        if spec.capabilities.needs_model and getattr(args, opt):
            model = getattr(args, f"{opt}_model") or found.get(name)
            if model:
                in_target[name] = model
    return StackConfig(
        in_target_models=in_target,
        model=args.model, host=args.host, http_port=args.http_port,
        grpc_port=args.grpc_port, verifier_port=args.verifier_port, device=args.device,
        log_dir=args.log_dir, proposers=launches, metrics_port=args.metrics_port, tls=tls,
        verifier_replicas=args.verifier_replicas,
        tensor_parallel_size=args.tensor_parallel_size,
        verifier_args=[*caching, *shlex.split(args.verifier_args)],
        gateway_args=["--resume-wait-s", str(args.resume_wait_s),
                      *([] if args.prefix_routing else ["--no-prefix-routing"]),
                      *shlex.split(args.gateway_args)])


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Start the stack, print where it serves, supervise it until SIGINT or SIGTERM."""
    if args.verifier_replicas < 1:
        parser.error("--verifier-replicas must be at least 1")
    if args.tensor_parallel_size < 1:
        parser.error("--tensor-parallel-size must be at least 1")
    certs_dir = Path(tempfile.mkdtemp(prefix="splitspec-tls-")) if args.tls else None
    try:
        from splitspec.tls_certs import LOCAL_HOSTS, write_stack_certificates

        tls = (write_stack_certificates(certs_dir, [*LOCAL_HOSTS, args.host])
               if certs_dir else None)
        stack = Stack(stack_config(args, tls))
    except ValueError as exc:
        parser.error(str(exc))
    try:
        _run(args, stack)
    finally:
        if certs_dir is not None:
            shutil.rmtree(certs_dir, ignore_errors=True)


def _run(args: argparse.Namespace, stack: Stack) -> None:
    stopping = False

    def on_signal(signum, frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        stack.start()
    except RuntimeError as exc:
        print(f"splitspec: {exc}", file=sys.stderr)
        sys.exit(1)
    print(serving_banner(args, stack), flush=True)
    supervisor = stack.supervisor()
    try:
        while not stopping:
            supervisor.poll()
            time.sleep(0.2)
    finally:
        stack.stop()
        print("splitspec: stopped", flush=True)
