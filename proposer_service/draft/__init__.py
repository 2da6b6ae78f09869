"""The draft-model proposer: a smaller causal LM of the target's tokenizer drafting k tokens
(proposer.py), its KV cache per sequence (cache.py, session.py) and the reuse of a shared prefix's
(prefix.py), the k-step loop (loop.py) and
its captured graphs (graphs.py), branching into trees where its mass splits (branches.py), and
the draft sharded over tensor-parallel ranks (tp.py).

May import the proposer's base, config, sampling and tree_builder; imported by the server
(tensor parallelism) and, by name, by splitspec/methods.py's registry.
"""
