"""Continuous batching: a request inside the verifier (sequence.py: its tokens, block table,
plan, stats and output queue), its output bookkeeping (output.py: incremental detokenization,
stop conditions), the scheduler that admits, preempts and reserves slots (scheduler.py), and
prefix caching's side of admission: a request's cached blocks and the blocks it offers
(prefix_cache.py).

May import kv/ and telemetry/ (a sequence's block table and stats); imported by methods/,
step/, drafts/ and the top.
"""
