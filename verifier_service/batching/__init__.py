"""Continuous batching: a request inside the verifier (sequence.py: its tokens, block table,
plan, stats and output queue), its output bookkeeping (output.py: incremental detokenization,
stop conditions) and the scheduler that admits, preempts and reserves slots (scheduler.py).

May import kv/ and telemetry/ (a sequence's block table and stats); imported by methods/,
step/, drafts/ and the top.
"""
