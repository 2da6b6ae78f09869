"""Start the whole stack locally: proposer(s), verifier and gateway as separate processes.

    splitspec up [--model DIR] [--http-port 8000] [--no-draft] [--no-mlp]
                 [--verifier-replicas N] [--tensor-parallel-size N]
                 [--verifier-args '--max-waiting 64'] ...

One proposer process per method of the registry (splitspec/methods.py), each added to the
verifier's --proposer list. Methods without a model (n-gram) always run; a model-backed method
runs when its model is given (--draft-model, --mlp-model, ...) or, by default, when its directory
(`draft/`, `mlp-speculator/`) sits next to the target and fits it (same tokenizer file; a
speculator with the target's hidden and vocabulary sizes). --no-METHOD leaves one out.

--tls runs the whole stack with mutual TLS: a throwaway CA and a certificate per role are
written into a temporary directory (removed on exit), every gRPC hop requires and checks client
certificates (verifiers serve only the gateway, proposers only verifiers), and the gateway's
front doors serve HTTPS and gRPC over TLS with its certificate; clients trust the printed ca.pem.

--verifier-replicas N starts N verifiers, all sharing the proposers, behind the one gateway:
the first on --verifier-port, the others on the next ports that no other service has (the
defaults never collide; a port given to two services is refused). --tensor-parallel-size N
splits each verifier's target over N devices (N processes per verifier; on accelerators, give
each replica a host of its own). Any service flag passes
through: --gateway-args, --verifier-args, --proposer-args (every proposer) and --METHOD-args
take a quoted flag list.

Prints the gateway URL once every service reports healthy, then supervises them: a service that
exits is started again with backoff while the others keep serving
(splitspec/launcher/supervisor.py). SIGINT or SIGTERM stops all of them (children are in their
own process group, so nothing is left behind). The integration tests use the same `Stack` class
with free ports.
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


def add_command(commands: argparse._SubParsersAction) -> None:
    """Register `up` and its flags (one set per method of the registry)."""
    up = commands.add_parser("up", help="serve gateway + verifier + proposers locally",
                             description=__doc__,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    d = StackConfig()
    up.add_argument("--model", default=d.model, help="target model directory")
    up.add_argument("--host", default=d.host)
    up.add_argument("--http-port", type=int, default=d.http_port)
    up.add_argument("--grpc-port", type=int, default=d.grpc_port)
    up.add_argument("--verifier-port", type=int, default=d.verifier_port,
                    help="the first verifier's port; further replicas take the next ports that "
                    "no other service has")
    up.add_argument("--verifier-replicas", type=int, default=d.verifier_replicas,
                    help="verifiers behind the gateway, sharing the proposers")
    up.add_argument("--tensor-parallel-size", type=int, default=d.tensor_parallel_size,
                    help="devices each verifier splits the target over (it starts one process "
                    "per device; docs/deploy.md: replicas or tensor parallelism)")
    flags = "a quoted list of flags, e.g. '--max-waiting 64 --max-num-seqs 16'"
    up.add_argument("--gateway-args", default="", help=f"passed to the gateway: {flags}")
    up.add_argument("--verifier-args", default="", help=f"passed to every verifier: {flags}")
    up.add_argument("--proposer-args", default="", help=f"passed to every proposer: {flags}")
    up.add_argument("--resume-wait-s", type=float, default=30.0,
                    help="how long the gateway lets a stream whose verifier died wait for one "
                    "to serve again (the supervisor restarts it)")
    up.add_argument("--prefix-routing", action=argparse.BooleanOptionalAction, default=True,
                    help="the gateway sends a request to the verifier replica recently sent its "
                    "longest prompt prefix (--no-prefix-routing: least requests in flight)")
    up.add_argument("--device", default=d.device)
    up.add_argument("--tls", action="store_true",
                    help="mutual TLS on every hop and HTTPS at the front door, with a throwaway "
                    "CA and certificates in a temporary directory")
    up.add_argument("--log-dir", type=Path, default=None,
                    help="write each service's log here (default: this terminal)")
    up.add_argument("--metrics-port", type=int, default=d.metrics_port,
                    help="Prometheus /metrics of the gateway; the verifier and proposers get the "
                    "next ports (0: off)")
    up.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                    default=True, help="reuse the KV of prompt prefixes computed before, in "
                    "the verifiers and the draft proposer (--no-enable-prefix-caching: off)")
    for name, spec in proposer_methods().items():  # per proposer: on/off, port, model, device
        up.add_argument(f"--{name}", action=argparse.BooleanOptionalAction, default=True,
                        help=f"run the {name} proposer ({spec.summary})"
                        + (" when its model is found" if spec.capabilities.needs_model else ""))
        up.add_argument(f"--{name}-port", type=int, default=spec.default_port)
        up.add_argument(f"--{name}-args", default="",
                        help=f"passed to the {name} proposer (after --proposer-args)")
        if spec.capabilities.needs_model:
            up.add_argument(f"--{name}-model", default=None,
                            help=f"its model directory (default: TARGET-{spec.model_dir}/, "
                            f"else {spec.model_dir}/ next to the target, if it fits)")
            up.add_argument(f"--{name}-device", default=None,
                            help="its device (default: --device)")
    for name, spec in in_target_methods().items():  # in-target methods backed by a model
        if spec.capabilities.needs_model:
            up.add_argument(f"--{name}", action=argparse.BooleanOptionalAction, default=True,
                            help=f"serve {name} in the verifiers ({spec.summary}) when its "
                            "model is found")
            up.add_argument(f"--{name}-model", default=None,
                            help=f"its model directory (default: TARGET-{spec.model_dir}/, "
                            f"else {spec.model_dir}/ next to the target, if it fits)")
    up.set_defaults(run=lambda args: run(args, up))


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
    print(f"splitspec is serving {args.model} (proposers: {', '.join(stack.proposers)}; "
          f"verifier replicas: {len(stack.verifiers)}"
          + (f", each over {args.tensor_parallel_size} tensor-parallel ranks"
             if args.tensor_parallel_size > 1 else "") + ")\n"
          f"  REST (OpenAI-compatible): {stack.url}\n"
          f"  gRPC (splitspec.v1.Generation): {args.host}:{args.grpc_port}\n"
          + "".join(f"  metrics of {name}: {url}\n" for name, url in stack.metrics_urls.items())
          + (f"  TLS: mutual TLS on every hop; clients trust {stack.config.tls.ca} (and may "
             f"present {stack.config.tls['client'].cert} / .key); removed on exit\n"
             if stack.config.tls else "")
          + "Ctrl-C stops everything.", flush=True)
    supervisor = stack.supervisor()
    try:
        while not stopping:
            supervisor.poll()
            time.sleep(0.2)
    finally:
        stack.stop()
        print("splitspec: stopped", flush=True)
