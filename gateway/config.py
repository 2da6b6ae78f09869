"""Configuration of the gateway process."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.prefix_index import PrefixRoutingConfig
from gateway.tool_parsers import PARSERS
from splitspec.config import option
from splitspec.tls_options import GROUP as TLS_GROUP
from splitspec.tls_options import TlsClientOptions, TlsServerOptions


@dataclass(frozen=True)
class GatewayConfig(TlsServerOptions, TlsClientOptions):
    """Serve the public REST and gRPC APIs in front of one or more verifiers.

    TLS: --tls-cert/--tls-key serve both front doors (HTTPS, gRPC over TLS); --tls-ca is what
    the verifiers' certificates are checked against, --tls-client-cert/--tls-client-key what
    the gateway presents to them; --tls-front-door-ca makes the front doors require client
    certificates too (API keys authenticate clients otherwise)."""

    host: str = option("127.0.0.1", "address to listen on")
    http_port: int = option(8000, "REST (OpenAI-compatible) port")
    grpc_port: int = option(50050, "public gRPC (Generation service) port")
    verifier: tuple[str, ...] = option(("127.0.0.1:50051",), "a verifier replica HOST:PORT")
    info_ttl_s: float = option(5.0, "how long verifier Info (model, proposers) is cached")
    max_prompts: int = option(16, "most prompts in one completions request")
    api_key_file: str = option(
        "", "file of API keys, one per line; requests must send one as a Bearer token "
        "(also SPLITSPEC_API_KEYS, comma-separated; none: no keys needed)")
    max_body_bytes: int = option(16 * 1024 * 1024, "largest REST request body (0: no limit)")
    max_concurrent_per_key: int = option(
        0, "requests in flight per API key (keyless requests share one count); 0: no limit")
    header_timeout_s: float = option(
        10.0, "a REST connection must send a request's headers within this time (0: no limit)")
    body_timeout_s: float = option(
        30.0, "a REST request's body must arrive within this time (0: no limit)")
    health_interval_s: float = option(
        1.0, "how often the gRPC health status is matched to the verifiers' (as REST /health)")
    speculative_disable_queue_size: int = option(
        0, "speculation off for new auto requests while a verifier's running + waiting count "
        "is at least this (0: never)")
    stats_interval_ms: int = option(500, "how often each verifier streams its stats to the "
                                    "speculation policy")
    max_pending: int = option(
        1024, "requests in flight at the gateway; more get 429 / RESOURCE_EXHAUSTED (0: no bound)")
    resume_wait_s: float = option(
        0.0, "how long a stream whose verifier went away waits for one to serve again, when no "
        "other replica can take it over (e.g. one replica restarted by a supervisor)")
    prefix_routing: bool = option(
        True, "send a request to the verifier replica recently sent its longest prompt prefix "
        "(its KV is likely cached there); --no-prefix-routing: least requests in flight only")
    prefix_routing_threshold: float = option(
        0.3, "least share of a prompt (0-1) that must match a replica's recent prefixes to "
        "route by prefix")
    prefix_routing_max_imbalance: int = option(
        8, "a prefix match is ignored when its replica has more than this many requests in "
        "flight beyond the least loaded one")
    prefix_routing_max_blocks: int = option(
        65536, "prefix blocks remembered per verifier replica (LRU; about 140 bytes each)")
    tls_front_door_ca: str = option(
        "", "PEM CA bundle: clients of the REST and gRPC front doors must present a certificate "
        "it signed (needs --tls-cert; default: none, API keys authenticate them)", group=TLS_GROUP)
    enable_auto_tool_choice: bool = option(
        False, "chat requests with tools may leave the choice to the model (tool_choice auto, "
        "the default with tools): its calls are read out of the output by --tool-call-parser")
    tool_call_parser: str = option(
        "hermes", "the served model's tool-call format, for auto tool choice",
        choices=tuple(PARSERS))
    log_level: str = option("INFO", "logging level")

    def auto_tool_parser(self) -> str | None:
        """The tool-call format auto tool choice reads; None: auto is not served."""
        return self.tool_call_parser if self.enable_auto_tool_choice else None

    def prefix_routing_config(self) -> PrefixRoutingConfig:
        return PrefixRoutingConfig(self.prefix_routing, self.prefix_routing_threshold,
                                   self.prefix_routing_max_imbalance,
                                   self.prefix_routing_max_blocks)
