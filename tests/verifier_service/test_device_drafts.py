"""Drafts an in-target head leaves on the device reach the step's forward and samplers with no
read back before it (verifier_service/step/device_drafts.py):

- the plan with device trees placed over it on the device equals the plan the host builds from
  the same trees as lists (ids, positions, node bits, ancestor relation), for random steps of
  trees, chains and prefill rows, at exact shapes and in buckets;
- every engine step waits once (its one HostFetch), whatever the method: EAGLE greedy and
  sampled chains, EAGLE-2 trees greedy and sampled, mixed with plain requests, and the EAGLE
  drafts entering the step are still on the device; a read back put back before the plan
  fails the count;
- a malformed q (NaN, or a token outside its own support) costs only its sequence's
  speculation: nothing of its draft is accepted, the request finishes, greedy and seeded
  output stay those of speculation off."""

from __future__ import annotations

import asyncio
import dataclasses
import random

import planted_bugs as bug
import pytest
import torch
from engine_testlib import drained, make_engine, request_ids, run_all

from kernels.layout import StepLayout
from kernels.paged_attention import visibility
from splitspec import device as dev
from splitspec.params import SamplingParams
from verifier_service import engine as engine_module
from verifier_service.methods.eagle import method as eagle
from verifier_service.methods.in_target import DeviceDraft
from verifier_service.step import device_drafts
from verifier_service.step.executor import _patch
from verifier_service.step.plan import BucketLadder, plan_step

BLOCK, TRASH, VOCAB = 4, 0, 500


def _random_step(rng: random.Random):
    b = rng.randint(1, 4)
    ks = [rng.choice([0, 1, 3, rng.randint(2, 9)]) for _ in range(b)]
    decoding = rng.random() < 0.5  # every sequence one uncached row: a bucket step
    new = [1 if decoding else rng.choice([1, rng.randint(1, 4)]) for _ in range(b)]
    start = [rng.randint(0, 30) for _ in range(b)]
    parents = [[rng.randint(-1, d - 1) if rng.random() < 0.7 else d - 1 for d in range(k)]
               for k in ks]
    on_device = [k > 1 and rng.random() < 0.7 for k in ks]
    return new, ks, start, parents, on_device


def check_placed_plans_equal_the_hosts(seed: int) -> None:
    rng = random.Random(seed)
    ladder = BucketLadder([1, 2, 4], [1, 2, 4, 8, 16])
    for _ in range(30):
        new, ks, start, parents, on_device = _random_step(rng)
        q = [n + k for n, k in zip(new, ks)]
        tokens = [[rng.randrange(VOCAB) for _ in range(k)] for k in ks]
        prompt = [[rng.randrange(VOCAB) for _ in range(n)] for n in new]
        tables = [list(range(1 + 10 * i, 1 + 10 * i + -(-(s + n) // BLOCK)))
                  for i, (s, n) in enumerate(zip(start, q))]
        ids = [t for p, d in zip(prompt, tokens) for t in p + d]
        for use_ladder in (None, ladder):
            want = plan_step(StepLayout.build(q, start, ks, [True] * len(q), parents), ids,
                             tables, BLOCK, TRASH, use_ladder, 8)
            drafts = []
            for k, par, toks, held in zip(ks, parents, tokens, on_device):
                if not k:
                    drafts.append(None)
                elif held:
                    drafts.append(DeviceDraft("s", [0] * k, parents=[-1] * k,
                                              device_tokens=torch.tensor(toks),
                                              device_parents=torch.tensor(par), max_depth=k,
                                              max_children=k))
                else:
                    drafts.append(DeviceDraft("s", list(toks), parents=list(par)))
            placeholder = [None if d is None or d.is_chain else d.parents for d in drafts]
            layout = StepLayout.build(q, start, ks, [True] * len(q), placeholder
                                      if any(p is not None for p in placeholder) else None)
            host_ids = [t for p, d in zip(prompt, drafts) for t in p + (d.tokens if d else [])]
            got = plan_step(layout, host_ids, tables, BLOCK, TRASH, use_ladder, 8)
            held = device_drafts.held(drafts)
            device_drafts.place(got, layout, drafts, ks, held, VOCAB, torch.device("cpu"))
            flat = got.host.clone()
            _patch(flat, got)
            assert got.bucket == want.bucket
            a, b = got.fields.views(flat), want.fields.views(want.host)
            for name in a:  # a tree that is a chain is planned as a tree: same visibility
                if name not in ("first_node", "node_bits"):
                    assert torch.equal(a[name], b[name]), (name, new, ks, parents, on_device)
            real = torch.arange(max(q))[None, :] < torch.tensor(q)[:, None]  # padding: unread
            assert torch.equal(_seen(a, got.max_context)[:len(q), :max(q)][real],
                               _seen(b, want.max_context)[:len(q), :max(q)][real])
            if got.bucket is None:
                assert torch.equal(_relation(got), _relation(want))


def _seen(v: dict, max_ctx: int) -> torch.Tensor:
    """Which context columns each padded query row sees, from a plan's arrays."""
    b, max_q = v["query_index"].shape
    bits = v["node_bits"].new_zeros(b * max_q).index_copy_(0, v["packed_index"], v["node_bits"])
    return visibility(v["start"], v["context_lens"], v["first_node"], bits.view(b, max_q),
                      max_ctx)[:, :max_q]


def _relation(plan) -> torch.Tensor:
    """The exact step's ancestor relation (the causal one where the plan has none)."""
    if plan.ancestors is not None:
        return plan.ancestors.cpu()
    q = plan.layout.query_lens.tolist()
    out = torch.zeros(len(q), max(q), max(q), dtype=torch.bool)
    for i, n in enumerate(q):
        out[i, :n, :n] = torch.tril(torch.ones(n, n, dtype=torch.bool))
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_device_trees_placed_on_the_plan_equal_the_hosts_plan(seed):
    check_placed_plans_equal_the_hosts(seed)


def test_the_check_catches_a_mask_without_its_ancestors_further_up(monkeypatch):
    bug.tree_mask_without_closure(monkeypatch)
    with pytest.raises(AssertionError):
        check_placed_plans_equal_the_hosts(0)


# -- one wait per step ------------------------------------------------------------------------

PROMPTS = [[5, 17, 42, 8, 33, 61, 12, 70, 3, 25] * 2, [100, 200, 300, 7, 9, 11] * 3,
           list(range(40, 70)), [7, 7, 7, 9, 11, 13] * 3]
SEEDED = SamplingParams(temperature=0.9, seed=5)
UNSEEDED = SamplingParams(temperature=0.8)


def _tree(inp, branches: int):
    return dataclasses.replace(inp, speculation=dataclasses.replace(
        inp.speculation, num_branches=branches))


MIXES = {
    "greedy chains": [("eagle", 4, None, 1), ("eagle", 2, None, 1)],
    "sampled chains": [("eagle", 4, SEEDED, 1), ("eagle", 3, UNSEEDED, 1)],
    "greedy trees": [("eagle", 6, None, 2), ("eagle", 5, None, 3)],
    "sampled trees": [("eagle", 6, SEEDED, 2), ("eagle", 5, UNSEEDED, 3)],
    "mixed": [("eagle", 4, None, 1), ("eagle", 5, SEEDED, 2), ("eagle", 3, UNSEEDED, 1),
              (None, 0, None, 1), ("eagle", 6, None, 3)],
}


def _inputs(mix):
    out = []
    for i, (method, k, sampling, branches) in enumerate(mix):
        inp = request_ids(f"r{i}", PROMPTS[i % len(PROMPTS)], max_tokens=14, k=k,
                          method=method or "ngram", sampling=sampling)
        out.append(_tree(inp, branches) if branches > 1 else inp)
    return out


def count_waits(target_dir: str, mix) -> tuple[list[int], int, int]:
    """Serve the mix: the waits of every engine step, the EAGLE drafts that entered a step
    and how many of them were still on the device."""
    engine = make_engine(target_dir, proposers={}, eagle=f"{target_dir}-eagle",
                         max_num_batched_tokens=64)
    waits, seen = [], [0, 0]
    calls = [0]
    real_fetch, real_step, real_verify = (dev.HostFetch.__call__, engine_module.Engine._run_step,
                                          engine_module.verify_step)

    def fetch(self, *args, **kwargs):
        calls[0] += 1
        return real_fetch(self, *args, **kwargs)

    async def run_step(self, *args, **kwargs):
        before = calls[0]
        out = await real_step(self, *args, **kwargs)
        waits.append(calls[0] - before)
        return out

    def verify(executor, batch, drafts, *args):
        for s, d in zip(batch, drafts):
            if d is not None and s.seq.inp.speculation.method == "eagle":
                seen[0] += 1
                seen[1] += isinstance(d, DeviceDraft) and d.on_device
        return real_verify(executor, batch, drafts, *args)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dev.HostFetch, "__call__", fetch)
        mp.setattr(engine_module.Engine, "_run_step", run_step)
        mp.setattr(engine_module, "verify_step", verify)
        asyncio.run(run_all(engine, _inputs(mix)))
    assert drained(engine)
    return waits, seen[0], seen[1]


def check_one_wait_per_step(target_dir: str, mix) -> None:
    waits, drafts, held = count_waits(target_dir, mix)
    assert waits and drafts > 0
    assert waits == [1] * len(waits), waits
    assert held == drafts  # every EAGLE draft entered its step unread


@pytest.mark.parametrize("mix", list(MIXES), ids=list(MIXES))
def test_every_step_waits_once(target_model_dir, mix):
    check_one_wait_per_step(target_model_dir, MIXES[mix])


def test_a_read_back_before_the_plan_fails_the_count(monkeypatch, target_model_dir):
    bug.device_drafts_read_back_before_the_plan(monkeypatch)
    with pytest.raises(AssertionError):
        check_one_wait_per_step(target_model_dir, MIXES["greedy trees"])


# -- a malformed q ---------------------------------------------------------------------------

def _spoil(kind: str):
    """device_sampled_chain with its q spoiled: NaN probabilities, or support without the
    token (each id moved by one)."""
    real = eagle.device_sampled_chain

    def spoiled(ids, q_ids, q_probs):
        if kind == "nan":
            q_probs = torch.full_like(q_probs, float("nan"))
        else:
            q_ids = torch.where(q_ids == ids[:, None], q_ids.max() + 1, q_ids)
        return real(ids, q_ids, q_probs)

    return spoiled


def check_bad_q_costs_only_speculation(target_dir: str, kind: str) -> None:
    plain = [request_ids("off", PROMPTS[0], max_tokens=12, sampling=SEEDED),
             request_ids("greedy-off", PROMPTS[1], max_tokens=12)]
    off = [t for t, _, _ in asyncio.run(run_all(make_engine(target_dir, proposers={}), plain))]
    engine = make_engine(target_dir, proposers={}, eagle=f"{target_dir}-eagle")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(eagle, "device_sampled_chain", _spoil(kind))
        out = asyncio.run(run_all(engine, [
            request_ids("seeded", PROMPTS[0], max_tokens=12, k=4, method="eagle",
                        sampling=SEEDED),
            request_ids("greedy", PROMPTS[1], max_tokens=12, k=4, method="eagle"),
            request_ids("unseeded", PROMPTS[2], max_tokens=12, k=4, method="eagle",
                        sampling=UNSEEDED)]))
    assert drained(engine)
    tokens = [t for t, _, _ in out]
    assert tokens[:2] == off and len(tokens[2]) == 12
    counts = engine.stats.method("eagle").counts()
    assert counts.greedy.accepted > 0  # the greedy chain beside them is untouched
    assert counts.sampled.tried > 0 and counts.sampled.accepted == 0


@pytest.mark.parametrize("kind", ["nan", "outside"])
def test_a_malformed_q_costs_only_its_sequences_speculation(target_model_dir, kind):
    check_bad_q_costs_only_speculation(target_model_dir, kind)


def test_the_check_catches_the_q_guard_left_out(monkeypatch, target_model_dir):
    bug.device_q_unchecked(monkeypatch)
    with pytest.raises(AssertionError):
        check_bad_q_costs_only_speculation(target_model_dir, "outside")
