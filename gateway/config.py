"""Configuration of the gateway process."""

from __future__ import annotations

from dataclasses import dataclass

from splitspec.config import option


@dataclass(frozen=True)
class GatewayConfig:
    """Serve the public REST and gRPC APIs in front of one or more verifiers."""

    host: str = option("127.0.0.1", "address to listen on")
    http_port: int = option(8000, "REST (OpenAI-compatible) port")
    grpc_port: int = option(50050, "public gRPC (Generation service) port")
    verifier: tuple[str, ...] = option(("127.0.0.1:50051",), "a verifier replica HOST:PORT")
    info_ttl_s: float = option(5.0, "how long verifier Info (model, proposers) is cached")
    max_prompts: int = option(16, "most prompts in one completions request")
    speculative_disable_queue_size: int = option(
        0, "speculation off for new auto requests while a verifier's running + waiting count "
        "is at least this (0: never)")
    stats_interval_ms: int = option(500, "how often each verifier streams its stats to the "
                                    "speculation policy")
    log_level: str = option("INFO", "logging level")
