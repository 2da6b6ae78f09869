"""The proposer's metrics (metrics.py), spans (tracing.py) and the two wired together for the
server (service.py). Imports nothing of the proposer service; imported by the servicer and the
server.
"""
