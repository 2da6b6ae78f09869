"""What the verifier measures and how it leaves the process: the engine's stats as plain
dataclasses the engine fills (stats.py), their Prometheus exporter (metrics.py), the spans of a
request and a step (tracing.py), and the two wired together for the server (service.py).

Imports nothing of the verifier (splitspec.telemetry for the shared plumbing); the stats are
imported by batching/, drafts/ and the top (engine, servicer), the exporters by the server
and the servicer (its spans).
"""
