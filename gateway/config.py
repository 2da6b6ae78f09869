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
    max_pending: int = option(
        1024, "requests in flight at the gateway; more get 429 / RESOURCE_EXHAUSTED (0: no bound)")
    resume_wait_s: float = option(
        0.0, "how long a stream whose verifier went away waits for one to serve again, when no "
        "other replica can take it over (e.g. one replica restarted by a supervisor)")
    log_level: str = option("INFO", "logging level")
