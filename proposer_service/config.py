"""Configuration of one proposer process."""

from __future__ import annotations

from dataclasses import dataclass

from splitspec.config import option


@dataclass(frozen=True)
class ProposerConfig:
    """Serve one proposer method over gRPC."""

    method: str = option("ngram", "proposer method", choices=("ngram",))
    host: str = option("127.0.0.1", "address to listen on")
    port: int = option(50052, "gRPC port")
    ngram_min: int = option(1, "shortest suffix the n-gram proposer matches")
    ngram_max: int = option(4, "longest suffix the n-gram proposer matches")
    max_num_speculative_tokens: int = option(16, "largest k this proposer serves")
    idle_timeout_s: float = option(600.0, "forget a sequence not heard of for this long")
    log_level: str = option("INFO", "logging level")
