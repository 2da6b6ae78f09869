"""A tensor-parallel verifier (verifier_service/tp/worker.py) serving at TP 2 over gloo, rank 0
in this process and rank 1 in its own, for the toy family and a tiny random checkpoint of each
lean family (Llama, Mistral, Qwen2):

- greedy output with speculation equals greedy output without it, for chains (n-gram), token
  trees (n-gram with branches) and lookahead (scratch rows: cache moves on every rank), in one
  batch with plain requests; on the toy family also for EAGLE chains and trees (the head drafts
  on rank 0), with seeded sampled EAGLE output equal to seeded output without speculation;
- a hidden-state proposer gets, from rank 0, the whole final hidden state of the row that
  produced the last token (as the plain model computes it);
- teacher-forced, the argmax after every prefix of held-out text agrees with TP 1's;
- a rank holds at most 0.55x of TP 1's weight bytes, and half its KV bytes for the same blocks;
- every step costs exactly one host broadcast, and the forward's own collectives only (two
  all-reduces per layer, one for the embedding, one all-gather for the head).
The numbers are printed (`pytest -s`); docs/architecture.md reports them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import pytest
import torch
from engine_testlib import PROMPTS, make_engine, request, request_ids, run_all
from test_conditioning import RecordingProposer
from tp_testlib import TPServe, teacher_forced_argmax, tiny_family
from transformers import AutoModelForCausalLM

from kernels.layout import StepLayout
from splitspec.params import SamplingParams
from splitspec.tensor_parallel import weight_bytes

REPO = Path(__file__).resolve().parents[2]
FAMILIES = ("target", "llama", "mistral", "qwen2")
PROCESSED = SamplingParams(temperature=0.0, presence_penalty=0.6, frequency_penalty=0.8,
                           repetition_penalty=1.3, logit_bias=((7, 2.0),))
HELD_OUT_TOKENS = 1024  # teacher-forced positions per family (toy target: its held-out code)


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, target_model_dir, tmp_path_factory):
    name = request.param
    path = (target_model_dir if name == "target"  # (no sliding window: the lean forward's)
            else tiny_family(name, tmp_path_factory.mktemp(name), sliding_window=None))
    proposers = {"ngram": RecordingProposer()}
    # the toy family's EAGLE head drafts on rank 0 (test_eagle_tensor_parallel.py: its tables)
    head = {"eagle": f"{path}-eagle"} if name == "target" else {}
    served = TPServe(path, proposers, max_num_seqs=8, num_kv_blocks=64, **head)
    yield name, path, served, proposers["ngram"]
    served.close()


def _prompts(name: str, engine) -> list[list[int]]:
    if name == "target":
        return [list(engine.tokenizer.encode(p, add_special_tokens=False)) for p in PROMPTS[:2]]
    g = torch.Generator().manual_seed(1)  # repeated, so that prompt lookup finds drafts
    return [torch.randint(1, 1024, (n,), generator=g).tolist() * 2 for n in (5, 9, 6)]


def test_greedy_speculation_equals_plain_decoding(family):
    name, _, served, _ = family
    prompts = _prompts(name, served.engine)
    plans = {"off": {}, "chain": dict(k=3), "tree": dict(k=4, branches=2),
             "lookahead": dict(k=6, method="lookahead"),
             # logits processors: rank 0 processes every verified row with its own history
             "processed off": dict(proc=True), "processed chain": dict(k=3, proc=True),
             "processed tree": dict(k=4, branches=2, proc=True)}
    if name == "target":
        plans |= {"eagle": dict(k=4, method="eagle"),
                  "eagle tree": dict(k=6, branches=2, method="eagle"),
                  "seeded off": dict(seed=11), "seeded eagle": dict(k=4, method="eagle", seed=11)}
    inputs, keys = [], []
    for label, plan in plans.items():
        for i, p in enumerate(prompts):
            sampling = (SamplingParams(temperature=0.8, seed=plan["seed"] + i)
                        if "seed" in plan else PROCESSED if plan.get("proc") else None)
            inp = request_ids(f"{label}{i}", p, 10, k=plan.get("k", 0),
                              method=plan.get("method", "ngram"), sampling=sampling,
                              ignore_eos=True)
            if plan.get("branches"):
                inp = dataclasses.replace(inp, speculation=dataclasses.replace(
                    inp.speculation, num_branches=plan["branches"]))
            inputs.append(inp)
            keys.append((label, i))
    outs = dict(zip(keys, served.run(inputs)))
    for (label, i), (tokens, _, _) in outs.items():
        plain = ("seeded off" if label.startswith("seeded") else
                 "processed off" if label.startswith("processed") else "off")
        assert tokens == outs[(plain, i)][0], f"{name} {label} prompt {i}"

    def accepted(method: str) -> int:
        return sum(last.usage.accepted_tokens for (label, _), (_, _, last) in outs.items()
                   if plans[label].get("k") and plans[label].get("method", "ngram") == method)

    assert accepted("ngram") > 0  # speculation did emit drafted tokens
    # the processors changed what was generated
    assert any(outs[("processed off", i)][0] != outs[("off", i)][0] for i in range(len(prompts)))
    if name == "target":  # rank 0's head drafts from the whole tables: its drafts get accepted
        assert accepted("eagle") > 0


def test_every_step_costs_one_broadcast_and_the_forwards_own_collectives(family):
    name, path, served, _ = family
    counts, steps = served.group.counts, served.engine.stats.steps
    before = dict(counts)
    prompts = _prompts(name, served.engine)
    served.run([request_ids(f"c{i}", p, 8, k=3, ignore_eos=True)
                for i, p in enumerate(prompts)])
    ran = served.engine.stats.steps - steps
    delta = {k: counts[k] - before.get(k, 0) for k in counts}
    layers = served.engine.runner.config.num_hidden_layers
    print(f"\n[{name}] {ran} steps: {delta}")
    assert ran > 0
    assert delta["broadcast"] == ran  # one host broadcast per step, nothing per layer
    assert delta["all_reduce"] == ran * (2 * layers + 1)
    assert delta["all_gather"] == ran


def test_hidden_states_come_whole_from_rank_0(family):
    name, path, served, recorder = family
    if name != "target":
        pytest.skip("checked on the toy family (its drafts get accepted)")
    recorder.records.clear()
    served.run([request(served.engine, f"h{i}", p, max_tokens=12, k=4)
                for i, p in enumerate(PROMPTS[:2])])
    plain = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert len(recorder.records) >= 4
    for history, hidden in recorder.records:
        with torch.no_grad():
            ref = plain.model(input_ids=torch.tensor([history[:-1]])).last_hidden_state[0, -1]
        torch.testing.assert_close(hidden, ref, rtol=1e-3, atol=1e-3)


def _held_out(name: str, engine) -> list[int]:
    if name == "target":
        texts = [d["text"] for d in json.loads((REPO / "models" / "heldout-sample.json")
                                               .read_text())]
    else:
        texts = [p for p in PROMPTS] * 40
    ids = [t for text in texts for t in engine.tokenizer.encode(text, add_special_tokens=False)]
    return ids[:HELD_OUT_TOKENS]


def test_teacher_forced_argmax_agrees_with_tp1_and_a_rank_holds_its_share(family):
    name, path, served, _ = family
    single = make_engine(path, max_num_seqs=8, num_kv_blocks=64)
    ids = _held_out(name, served.engine)
    chunk = min(255, served.engine.runner.max_model_len - 1)
    agree = total = 0
    for at in range(0, len(ids), chunk):
        part = ids[at:at + chunk]
        if len(part) < 2:
            continue
        tp2 = teacher_forced_argmax(served.engine, part)
        tp1 = teacher_forced_argmax(single, part)
        agree += sum(a == b for a, b in zip(tp2, tp1))
        total += len(part)
    w1, w2 = weight_bytes(single.runner._lean), weight_bytes(served.engine.runner._lean)
    kv1 = sum(t.numel() * t.element_size() for t in (single.runner.kv.k, single.runner.kv.v))
    kv2 = sum(t.numel() * t.element_size()
              for t in (served.engine.runner.kv.k, served.engine.runner.kv.v))
    print(f"\n[{name}] teacher-forced argmax TP 2 vs TP 1: {agree}/{total} = "
          f"{agree / total:.4%}; weights per rank {w2 / 2**20:.2f} MiB of {w1 / 2**20:.2f} "
          f"(x{w2 / w1:.3f}); KV per rank {kv2 / 2**20:.2f} MiB of {kv1 / 2**20:.2f} "
          f"(x{kv2 / kv1:.3f}, {single.runner.kv.num_blocks} blocks)")
    assert agree / total >= 0.999
    assert w2 <= 0.55 * w1
    assert served.engine.runner.kv.num_blocks == single.runner.kv.num_blocks
    assert kv2 * 2 == kv1


def test_the_teacher_forced_layout_gets_every_row():
    """teacher_forced_argmax's layout: one sequence, its first token then the rest as drafts."""
    layout = StepLayout.build([5], [0], [4], [True], None)
    assert layout.logits_indices.tolist() == [0, 1, 2, 3, 4]


def test_no_rank_exited(family):
    _, _, served, _ = family
    assert served.exits == []
    assert all(p.is_alive() for p in served.ranks.procs.values())


def test_prefix_cache_hits_at_tp2_give_the_output_of_tp1_without_caching(family):
    """Rank 0 decides the hits; every rank reads the same shared block ids (the plan's block
    tables), and rows kept on a hit are never moved into a shared block on any rank."""
    name, path, served, _ = family
    if name != "target":
        pytest.skip("checked on the toy family")
    engine = served.engine
    base = _prompts(name, engine)[0] * 3  # a few full blocks
    seed = request_ids("p-seed", base, 8, k=3, ignore_eos=True)
    wave = [request_ids(f"p{i}", base[:len(base) - 3 * i] + [5 + i, 9], 8, k=3 * (i % 2),
                        ignore_eos=True) for i in range(4)]
    hits, steps, broadcasts = (engine.prefix.stats.hits, engine.stats.steps,
                               served.group.counts["broadcast"])
    got = served.run([seed]) + served.run(wave)
    assert engine.prefix.stats.hits > hits
    assert served.group.counts["broadcast"] - broadcasts == engine.stats.steps - steps
    single = make_engine(path, max_num_seqs=8, num_kv_blocks=64, enable_prefix_caching=False)
    want = [t for t, _, _ in asyncio.run(run_all(single, [seed, *wave]))]
    assert [t for t, _, _ in got] == want
    assert [last.usage.cached_tokens > 0 for _, _, last in got[1:]] == [True] * 4
