"""The MLP speculator proposer: heads on the target's last hidden state (speculator.py), the
checkpoint format IBM's MLPSpeculator accelerators ship in (checkpoint.py) and the proposer
that serves them (proposer.py).

May import the proposer's base, sampling and tree_builder; imported by name by
splitspec/methods.py's registry.
"""
