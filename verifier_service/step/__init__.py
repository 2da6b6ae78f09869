"""One engine step on the target's device: the host's step plan (plan.py: padded arrays in one
buffer, a bucket per batch shape), the executor that replays one captured graph per bucket
(executor.py), the sampler of steps that verify nothing (sampler.py), the verification that
rejection-samples drafts and trees (verify.py), and the warm-up that captures every bucket
before SERVING (warmup.py).

May import batching/ (the scheduled batch) and methods.in_target's public names (drafts left on
the device); never the engine, the drafts' sources or the wire. Imported by model/, tp/ and the
top.
"""
