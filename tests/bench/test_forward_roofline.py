"""bench/forward_roofline.py: the roofline's arithmetic on a worked example (the real model's
shapes on the 2-core development machine's limits)."""

from __future__ import annotations

import sys

import pytest

from splitspec.launcher import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))

from forward_roofline import (  # noqa: E402
    GOALS,
    Samples,
    flops_per_row,
    goals,
    quiet_rounds,
    roofline_ms,
    weight_bytes,
    where_the_time_goes,
)

# SmolLM2-135M: the tied head [49152, 576] and 30 layers of q/k/v, o, gate/up and down
SHAPES = [(49152, 576)] + [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30
PARAMS = 49152 * 576 + 30 * (960 * 576 + 576 * 576 + 3072 * 576 + 576 * 1536)


def test_weights_and_flops_of_the_real_model():
    assert PARAMS == 134_479_872
    assert weight_bytes(SHAPES, "fp16") == weight_bytes(SHAPES, "fp16-dot") == 2 * PARAMS
    assert weight_bytes(SHAPES, "onednn") == weight_bytes(SHAPES, "dense") == 4 * PARAMS
    assert weight_bytes(SHAPES, "int8-dot") == PARAMS
    assert flops_per_row(SHAPES) == 2 * PARAMS  # a multiply and an add per weight per row


def test_the_floor_is_the_read_until_the_flops_take_longer():
    """269 MB of fp16 weights at 31 GB/s take 8.676 ms; 269 MFLOP per row at 200 GFLOP/s take
    1.345 ms a row, so the read bounds 1 to 6 rows (8.07 ms of FLOPs) and the FLOPs 7 and more
    (9.41 ms)."""
    nbytes, flops = weight_bytes(SHAPES, "fp16"), flops_per_row(SHAPES)
    read = 1000 * nbytes / 31e9
    assert read == pytest.approx(8.676, abs=1e-3)
    for rows in (1, 4, 6):
        assert roofline_ms(nbytes, flops, rows, 31e9, 200e9) == pytest.approx(read)
    assert roofline_ms(nbytes, flops, 7, 31e9, 200e9) == pytest.approx(9.414, abs=1e-3)
    assert roofline_ms(nbytes, flops, 10, 31e9, 200e9) == pytest.approx(13.448, abs=1e-3)
    # fp32 weights read twice the bytes: the read bounds them up to 12 rows
    assert roofline_ms(2 * nbytes, flops, 12, 31e9, 200e9) == pytest.approx(2 * read)
    assert roofline_ms(2 * nbytes, flops, 13, 31e9, 200e9) > 2 * read


def test_goals_hold_the_forward_against_the_read_and_one_row():
    """1 row at 10.0 ms against an 8.676 ms read (1.15x: met), 4 rows at 1.2x one row (missed),
    10 rows at 1.5x (met); the spread is the middle 80% of the rounds."""
    ms = {1: 10.0, 4: 12.0, 10: 15.0}
    cells = {"shapes": SHAPES, "chosen": "fp16-dot"}
    cells.update({("forward", "fp16-dot", 2, r): Samples([t / 1000] * 3) for r, t in ms.items()})
    nbytes = weight_bytes(SHAPES, "fp16")
    lines = goals(cells, {(nbytes, 2): 31e9}, [1, 2], 13)
    table = {line.split(" | ")[0].lstrip("| "): line for line in lines if line.startswith("| ")}
    assert [g[2] for g in GOALS] == [k for k in table if k not in ("goal", "---")][:3]
    assert "1.153x" in table["1 row / fp16 weight-read time"] and table[
        "1 row / fp16 weight-read time"].endswith("met |")
    assert "1.200x" in table["4 rows / 1 row"] and "MISSED" in table["4 rows / 1 row"]
    assert "1.500x" in table["10 rows / 1 row"] and table["10 rows / 1 row"].endswith("met |")
    assert Samples([0.001 * i for i in range(1, 11)]).spread() == "2.0-9.0"


def test_where_the_time_goes_splits_the_forward_into_products_and_the_rest():
    cells = {("forward", "fp16-dot", 2, 1): Samples([0.0138]),
             ("products", "fp16-dot", 2, 1): Samples([0.0087]),
             ("forward", "fp16-dot", 2, 4): Samples([0.0164]),
             ("products", "fp16-dot", 2, 4): Samples([0.0099])}
    text = where_the_time_goes(cells, "fp16-dot", 2, 8.7)[0]
    assert "the products take 8.7 ms (1.00x the fp16 weight-read time)" in text
    assert "the rest of the forward 5.1 ms" in text
    assert "From 1 to 4 rows the forward grows 2.6 ms: the products 1.2 ms (1.14x), " \
           "the rest 1.4 ms." in text


def test_only_the_rounds_other_processes_left_alone_count():
    """Rounds 1 and 4 were busy (another process on a core): with 5 quiet rounds left, the
    medians come from those; with fewer, every round counts and the report says so."""
    busy = {1, 4}
    times = [0.030 if i in busy else 0.010 for i in range(7)]
    cells = {"shapes": SHAPES, "others": [0.9 if i in busy else 0.05 for i in range(7)],
             ("forward", "fp16-dot", 2, 1): Samples(times)}
    kept, said = quiet_rounds(cells)
    assert kept[("forward", "fp16-dot", 2, 1)].times == [0.010] * 5
    assert "the 5 of 7 rounds" in said and kept["shapes"] is SHAPES
    cells["others"][0] = 0.5
    kept, said = quiet_rounds(cells)
    assert kept[("forward", "fp16-dot", 2, 1)].times == times and "every one of the 7" in said
