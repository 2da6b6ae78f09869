"""The model card (README.md) of an EAGLE head, written by scripts/train_eagle.py's eval stage
from the head's training.json and eval.json."""

from __future__ import annotations

import json
from pathlib import Path

TITLES = {"real": ("SmolLM2-135M-Instruct", "make real-model"),
          "toy": ("the toy code model (models/target)", "make models")}


def _row(values, fmt="{:.2f}") -> str:
    return " ".join(fmt.format(v) for v in values)


def card(a, out: Path, ev: dict) -> str:
    tr = json.loads((out / "training.json").read_text())
    spec = tr["spec"]
    name, how = TITLES[a.family]
    kinds = [k for k in ("chat", "code") if k in ev]
    acc_rows = "\n".join(
        f"| {k} ({ev[k]['answers']} answers, {ev[k]['answer_tokens']} tokens) | "
        f"{_row(ev[k]['chain_acceptance_per_position'])} |" for k in kinds)
    chain_rows = "\n".join(
        f"| {k} | {_row(ev[k]['chain_tokens_per_step'])} |" for k in kinds)
    budgets = sorted({int(b) for k in kinds for b in ev[k]["tree_tokens_per_step"]})
    tree_head = " | ".join(str(b) for b in budgets)
    tree_rows = "\n".join(
        f"| {k} | " + " | ".join(f"{ev[k]['tree_tokens_per_step'][str(b)]:.2f}"
                                 if str(b) in ev[k]['tree_tokens_per_step']
                                 else f"{ev[k]['tree_tokens_per_step'][b]:.2f}"
                                 for b in budgets) + " |" for k in kinds)
    others = ev.get("others", {})
    other_rows = []
    for k in kinds:
        o = others.get(k, {})
        head1 = ev[k]["chain_acceptance_per_position"]
        line = f"| {k} | {head1[0]:.2f} |"
        line += f" {o['mlp'][0]:.2f} |" if "mlp" in o else " - |"
        line += f" {o['draft'][0]:.2f} |" if "draft" in o else " - |"
        other_rows.append(line)
    curve = "\n".join(
        f"| {h['answer_tokens_seen']} | {h['minutes']} | "
        + " | ".join(f"{h['acceptance'].get(k, [0])[0]:.2f}" for k in kinds) + " |"
        for h in tr["history"])
    layers = tr["feature_layers"]
    vocab = tr["vocab"]
    tree = ev["tree"]
    weighting = ("rows predicting prompt tokens weigh " f"{tr['prompt_weight']}"
                 if tr["prompt_weight"] else "answer rows only")
    scaling = (" fc is trained on the features scaled to unit RMS per dimension (the scale is "
               "folded into the stored fc)." if tr.get("scale_features") else "")
    return f"""# EAGLE-3 head for {name}

A one-layer EAGLE-3 draft head on the target's own features, fitted to {name}
(`{how}`) for splitspec's in-target `eagle` method. Stored in the EAGLE-3 format
(`config.json`: a one-layer Llama config with `draft_vocab_size`; `model.safetensors`:
`midlayer.*`, `fc`, `norm`, `lm_head`, `d2t`, `t2d`), fp16, {tr['params'] / 1e6:.1f} M
parameters. Written by `scripts/train_eagle.py --family {a.family}` (`make models-eagle`); every
number below is in `training.json` and `eval.json`.

- features: the residual stream entering the target's layers {layers}, hidden
  {spec['target_hidden_size']} each, concatenated (fc: {spec['target_hidden_size'] * 3} ->
  {spec['hidden_size']})
- decoder layer: hidden {spec['hidden_size']}, {spec['num_heads']} query and
  {spec['num_kv_heads']} key/value heads of {spec['head_dim']}, MLP {spec['intermediate_size']}
- draft vocabulary: {spec['draft_vocab_size']} of {spec['vocab_size']} tokens (the tokens the
  target says in its answers, most frequent first, then the lowest ids); they cover
  {', '.join(f"{k} {v:.3f}" for k, v in vocab['heldout_coverage'].items())} of the held-out
  answers' tokens; target id = draft id + d2t[draft id]

## Training

Data: {tr['train_answers']} of the target's own greedy answers with its features at every
position (`runs/eagle-{a.family}/`, not shipped). {tr['steps']} AdamW steps of {tr['batch']}
answers (lr {tr['lr']}, warm-up then cosine), {tr['train_minutes']:.0f} minutes on one CPU
thread, {tr['answer_tokens_seen']} answer tokens seen. Loss: EAGLE-3's training-time test over
{tr['ttt_steps']} drafting steps (step s feeds the head its own outputs of step s - 1, weighted
{tr['ttt_decay']}^s), soft cross entropy against the target's top-8 next-token distribution,
{weighting}. lm_head and norm start from the target's output head rows and final norm.{scaling}

## Held-out greedy acceptance per position (chains)

Position i counts as accepted when the head's first i drafts, drafted from the true prefix with
its own states fed back, all equal the target's tokens. {tr['heldout_answers']} held-out answers.

| held-out | positions 1..{len(ev[kinds[0]]['chain_acceptance_per_position'])} |
|---|---|
{acc_rows}

Against the project's other learned speculators on the same answers (first position):

| held-out | EAGLE head | MLP speculator | draft |
|---|---|---|---|
{chr(10).join(other_rows)}

## Tokens per step

Greedy decoding simulated along the held-out answers (each step emits the accepted drafts and
one more token). Chains of 1..{len(ev[kinds[0]]['chain_tokens_per_step'])}:

| held-out | chain length 1.. |
|---|---|
{chain_rows}

EAGLE-2 dynamic trees (top-{tree['top_k']} frontier, depth {tree['depth']}, the node budget's
best candidates by cumulative log-probability), on the first
{ev[kinds[0]].get('tree_answers', '')} held-out answers of each kind:

| held-out | {tree_head} nodes |
|---|{'---|' * len(budgets)}
{tree_rows}

## First-position acceptance against training tokens

On every fifth held-out answer.

| answer tokens seen | minutes | {' | '.join(kinds)} |
|---:|---:|{'---:|' * len(kinds)}
{curve}
"""
