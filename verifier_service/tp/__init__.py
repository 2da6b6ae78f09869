"""Tensor parallelism of the target: what rank 0 sends the other ranks each step in one
broadcast (broadcast.py) and the loop those ranks run (worker.py).

May import config, kv/, step/ and model/ (each rank builds the same target and runs the same
step body); imported by the server.
"""
