"""splitspec/graphs.py on a device without graphs: every call runs the function eagerly on its
values (the proposers' replayed heads then equal their plain ones); nothing is captured."""

from __future__ import annotations

import torch

from splitspec.graphs import Replay


def test_without_graphs_a_replay_is_the_function_itself():
    replay = Replay(torch.device("cpu"))
    assert not replay.enabled

    def double(x):
        return x["a"] * 2

    assert not replay.capture(1, double, {"a": torch.zeros(3)})
    assert 1 not in replay
    assert replay(1, double, {"a": torch.arange(3)}).tolist() == [0, 2, 4]
