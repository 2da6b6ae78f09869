"""EAGLE-1/2 and EAGLE-3 heads drafting on the target's features, inside the verifier: the
checkpoint formats users have (checkpoint.py), the head's one-layer decoder and its drafting
loops on the device (head.py), captured chains and trees (graphs.py, batch_graphs.py), and the
in-target method the engine serves (method.py).

Part of methods/: may import methods.in_target and batching/; imported by model/ for
checkpoint.py alone.
"""
