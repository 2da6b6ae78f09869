"""Where a step's drafts come from: the Propose stream's client (client.py) and a proposer
method served by several processes (pool.py, addresses.py), the collector that asks proposers
and in-target methods and never trusts what they send (collector.py), whether to ask for
drafting ahead (ahead_policy.py) and how many tokens to ask for per step (adaptive_k.py).

May import batching/, telemetry/ (the stats they update) and methods.in_target's public names;
imported by the engine and the server.
"""
