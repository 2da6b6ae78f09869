"""Training and evaluation of an EAGLE-3 head for scripts/train_eagle.py (stages train, eval).

train     a head the target's own size (one Llama decoder layer over 2H inputs, fc over the
          three feature layers, norm, lm_head over the draft vocabulary of stage vocab),
          lm_head and norm initialised from the target's output head and final norm; AdamW on
          EAGLE-3's training-time test (scripts/eagle_ttt.py: every drafting depth on the head's
          own fed-back states, soft labels = the target's top-8 distribution); written in the
          EAGLE-3 format (fp16) with training.json. Resumable (--resume) from runs/.
eval      held-out acceptance per position of greedy chains (exact, from the training-time
          test's forward), tokens per step of chains and of EAGLE-2 trees at several node
          budgets (greedy decoding simulated against the target's own answer, the trees drafted
          by the verifier's code, verifier_service/methods/eagle/head.py), the MLP speculator and
          the draft on the same answers where they fit, then the head's README.md.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict
from pathlib import Path

import eagle_data as ed
import eagle_ttt
import torch

from verifier_service.methods.eagle.checkpoint import EagleSpec, EagleWeights, save_eagle3
from verifier_service.methods.eagle.head import EagleHead

PARAMS = ("fc", "q", "k", "v", "o", "input_norm", "hidden_norm", "post_norm", "gate", "up",
          "down", "norm", "lm_head")


def target_tensors(a) -> tuple[dict, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    cfg = json.loads((a.target / "config.json").read_text())
    w = load_file(str(a.target / "model.safetensors"))
    embed = next(v for k, v in w.items() if k.endswith("embed_tokens.weight")).float()
    head = w.get("lm_head.weight", embed).float()
    norm = next(v for k, v in w.items() if k.endswith("model.norm.weight")).float()
    return cfg, {"embed": embed, "head": head, "norm": norm}


def head_spec(a, cfg: dict, draft_vocab: int) -> EagleSpec:
    rope = cfg.get("rope_parameters") or {}
    H = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    return EagleSpec(
        version=3, hidden_size=H, num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads", heads),
        head_dim=cfg.get("head_dim") or H // heads, intermediate_size=cfg["intermediate_size"],
        vocab_size=cfg["vocab_size"], draft_vocab_size=draft_vocab, target_hidden_size=H,
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-5),
        rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
        aux_layer_ids=tuple(a.layers) if a.layers is not None else None,
        max_position_embeddings=cfg.get("max_position_embeddings", 2048))


def draft_maps(ids: list[int], vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(d2t offsets [Vd], t2d mask [V], t2d index [V]: draft id of a target id or -1)."""
    ids_t = torch.tensor(ids)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids_t] = True
    index = torch.full((vocab,), -1, dtype=torch.long)
    index[ids_t] = torch.arange(len(ids))
    return ids_t - torch.arange(len(ids)), t2d, index


def feature_scale(records: list[dict], n: int = 200) -> torch.Tensor:
    """1 / RMS of every feature dimension over the answer rows of up to n records [F]. The
    residual stream carries a few dimensions hundreds of times larger than the rest (and a few
    rows larger still: the attention sinks, in the prompt); scaling fc's inputs by this gives
    every input the same effective learning rate, and folds into fc's columns when saved."""
    sq, count = 0.0, 0
    for r in records[:n]:
        f = r["feats"][r["prompt_len"] - 1:].float()
        sq = sq + f.pow(2).sum(0)
        count += f.shape[0]
    return (sq / max(count, 1)).sqrt().clamp(min=1e-3).reciprocal()


class HeadParams(torch.nn.Module):
    """The trainable tensors of an EAGLE-3 head (float32). fc acts on the features scaled by
    `scale` (feature_scale); `weights()` gives the head as stored, the scale folded into fc."""

    def __init__(self, spec: EagleSpec, target: dict[str, torch.Tensor], ids: list[int],
                 scale: torch.Tensor | None = None, seed: int = 0):
        super().__init__()
        self.register_buffer("scale", torch.ones(spec.feature_size) if scale is None
                             else scale.float())
        g = torch.Generator().manual_seed(seed)
        H, D, inner = spec.hidden_size, spec.head_dim, spec.intermediate_size

        def r(*shape, std=0.02):
            return torch.nn.Parameter(torch.randn(*shape, generator=g) * std)

        self.fc = r(H, spec.feature_size)
        self.q = r(spec.num_heads * D, 2 * H)
        self.k = r(spec.num_kv_heads * D, 2 * H)
        self.v = r(spec.num_kv_heads * D, 2 * H)
        self.o = r(H, spec.num_heads * D, std=0.02 / 2)
        self.gate, self.up = r(inner, H), r(inner, H)
        self.down = r(H, inner, std=0.02 / 2)
        for name in ("input_norm", "hidden_norm", "post_norm"):
            setattr(self, name, torch.nn.Parameter(torch.ones(H)))
        self.norm = torch.nn.Parameter(target["norm"].clone())
        self.lm_head = torch.nn.Parameter(target["head"][torch.tensor(ids)].clone())

    def start_from(self, w: EagleWeights) -> None:
        """Take a stored head's tensors (fc unfolded from this run's feature scale)."""
        with torch.no_grad():
            for n in PARAMS:
                src = getattr(w, n).float()
                if n == "fc":
                    src = src / self.scale[None, :]
                getattr(self, n).copy_(src)

    def weights(self, d2t: torch.Tensor, t2d: torch.Tensor) -> EagleWeights:
        w = {n: getattr(self, n) for n in PARAMS}
        w["fc"] = self.fc * self.scale[None, :]
        return EagleWeights(**w, d2t=d2t, t2d=t2d)


def load_init(path) -> tuple[EagleSpec, EagleWeights, list[int], dict]:
    """A head to continue training from: (spec, weights, its draft vocabulary's target ids, the
    vocabulary record of its training.json, without the ids)."""
    from verifier_service.methods.eagle import checkpoint as eagle_format

    spec, w = eagle_format.load(path)
    ids = (torch.arange(len(w.d2t)) + w.d2t.long()).tolist()
    info = {}
    if (Path(path) / "training.json").exists():
        info = json.loads((Path(path) / "training.json").read_text()).get("vocab", {})
    return spec, w, ids, dict(info, draft_vocab_size=len(ids), ids=ids)


def _kinds(records: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in records:
        out.setdefault(r["kind"], []).append(r)
    return out


def kind_weights(records: list[dict], code_weight: float) -> list[float]:
    """Sampling weight of each training record: code answers `code_weight` times a chat answer's
    (1.0: every answer alike), so a chat-heavy answer set can still train a head half on code."""
    return [code_weight if r["kind"] == "code" else 1.0 for r in records]


def expected_share(records: list[dict], weights: list[float], kind: str) -> float:
    """The share of sampled records that are of `kind` under `weights`."""
    total = sum(weights)
    return sum(w for r, w in zip(records, weights) if r["kind"] == kind) / max(total, 1e-12)


def sample_batch(rng: random.Random, records: list[dict], weights: list[float] | None,
                 n: int) -> list[dict]:
    """n records: uniformly without replacement when weights is None, else drawn by weight."""
    if weights is None:
        return rng.sample(records, min(n, len(records)))
    return rng.choices(records, weights=weights, k=n)


def chain_acceptance(head: EagleHead, records: list[dict], k: int) -> list[float]:
    hits = [eagle_ttt.chain_hits(head, r, k) for r in records]
    hits = torch.cat([h for h in hits if len(h)])
    return hits.float().mean(0).tolist() if len(hits) else [0.0] * k


def train(a, log) -> None:
    from train_models import LMTrainConfig, lr_at, make_optimizer

    cfg, target = target_tensors(a)
    init = load_init(a.init) if getattr(a, "init", None) else None
    if init is not None:  # the starting head's draft vocabulary, so its lm_head rows still fit
        ids, vocab = init[2], init[3]
    else:
        vocab = json.loads((a.work / "vocab.json").read_text())
        ids = vocab["ids"]
    spec = head_spec(a, cfg, len(ids))
    d2t, t2d, t2d_index = draft_maps(ids, cfg["vocab_size"])
    train_recs = [r for d in sorted(a.work.glob("train*")) if d.is_dir()
                  for r in ed.load_records(d)]
    params = HeadParams(spec, target, ids, feature_scale(train_recs) if a.scale_features
                        else None)
    if init is not None:
        params.start_from(init[1])
        log(f"train: starting from the head in {a.init}")
    n_params = sum(p.numel() for p in params.parameters())
    val = ed.load_records(a.work / "val")
    probe = [r for i, r in enumerate(val) if i % 5 == 0]
    code_weight = float(getattr(a, "code_weight", 1.0))
    weights = None if code_weight == 1.0 else kind_weights(train_recs, code_weight)
    mix = {"code_weight": code_weight,
           "answers": {k: len(v) for k, v in sorted(_kinds(train_recs).items())},
           "expected_code_share": round(expected_share(
               train_recs, weights or [1.0] * len(train_recs), "code"), 4)}
    log(f"train: {n_params / 1e6:.2f} M parameters, draft vocabulary {len(ids)}, "
        f"{len(train_recs)} training answers, {len(val)} held out; TTT {a.ttt_steps} steps; "
        f"mix {json.dumps(mix)}")
    opt = make_optimizer(params, a.lr, weight_decay=0.0)
    sched = LMTrainConfig(steps=a.steps, batch_size=a.batch, seq_len=0, lr=a.lr, warmup=30,
                          minutes=a.train_minutes)
    state_path = a.work / "train-state.pt"
    step, seen, history, spent, started = 0, 0, [], 0.0, init_record(a)
    drawn = {"chat": 0, "code": 0}
    if a.resume and state_path.exists():
        st = torch.load(state_path)
        params.load_state_dict(st["params"])
        opt.load_state_dict(st["opt"])
        step, seen, history, spent = st["step"], st["seen"], st["history"], st["minutes"]
        drawn = st.get("drawn", drawn)
        started = st.get("init", started)  # what the first sitting started from
        log(f"train: resumed at step {step} ({seen} answer tokens, {spent:.1f} min)")
    rng = random.Random(1000 + step)
    t0 = time.time() - spent * 60

    def head() -> EagleHead:
        return EagleHead(spec, params.weights(d2t, t2d), target["embed"])

    def probe_eval() -> dict:
        params.eval()
        with torch.no_grad():
            h = head()
            out = {kind: chain_acceptance(h, recs, 3) for kind, recs in _kinds(probe).items()}
        params.train()
        return out

    while step < sched.steps:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, sched, time.time() - t0)
        h = head()
        loss_sum, weight = 0.0, 0.0
        for rec in sample_batch(rng, train_recs, weights, a.batch):
            drawn[rec["kind"]] = drawn.get(rec["kind"], 0) + 1
            loss, w, n = eagle_ttt.ttt_loss(h, rec, a.ttt_steps, t2d_index, a.ttt_decay,
                                            a.prompt_weight)
            loss_sum = loss_sum + loss
            weight += w
            seen += n
        loss = loss_sum / max(weight, 1e-6)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params.parameters(), 1.0)
        opt.step()
        step += 1
        minutes = (time.time() - t0) / 60
        if step % 10 == 0:
            log(f"train step {step} loss {loss.item():.3f} ({seen} answer tokens, "
                f"{minutes:.1f} min)")
        done = minutes > a.train_minutes or step >= sched.steps
        if step % a.eval_every == 0 or done:
            acc = probe_eval()
            history.append({"step": step, "answer_tokens_seen": seen,
                            "minutes": round(minutes, 1), "code_weight": code_weight,
                            "acceptance": acc})
            log(f"train eval step {step}: {json.dumps(acc)}")
            torch.save({"params": params.state_dict(), "opt": opt.state_dict(), "step": step,
                        "seen": seen, "history": history, "minutes": minutes,
                        "init": started, "drawn": drawn}, state_path)
        if done:
            break
    out = Path(a.out)
    save_eagle3(out, spec, params.weights(d2t, t2d))
    (out / "training.json").write_text(json.dumps({
        "params": n_params, "steps": step, "train_minutes": round((time.time() - t0) / 60, 1),
        "answer_tokens_seen": seen, "train_answers": len(train_recs), "heldout_answers": len(val),
        "spec": asdict(spec), "feature_layers": list(spec.feature_layers(cfg["num_hidden_layers"])),
        "ttt_steps": a.ttt_steps, "ttt_decay": a.ttt_decay, "prompt_weight": a.prompt_weight,
        "scale_features": bool(a.scale_features),
        "lr": a.lr, "batch": a.batch,
        "mix": dict(mix, records_drawn=drawn,
                    code_share_drawn=round(drawn.get("code", 0) / max(sum(drawn.values()), 1), 4)),
        "vocab": {k: v for k, v in vocab.items() if k != "ids"},
        "history": history, "init": started}, indent=2) + "\n")
    log(f"train: head written to {out}")


def init_record(a) -> dict | None:
    """What the run started from (--init): the directory and its own training summary."""
    if not getattr(a, "init", None):
        return None
    path = Path(a.init) / "training.json"
    prev = json.loads(path.read_text()) if path.exists() else {}
    return {"dir": str(Path(a.init).resolve().relative_to(Path(a.init).resolve().parents[1])),
            **{k: prev[k] for k in ("steps", "train_minutes", "answer_tokens_seen",
                                    "train_answers") if k in prev}}


# -- evaluation ----------------------------------------------------------------------------------

def tree_accepts(tokens: list[int], parents: list[int], truth: list[int]) -> int:
    """How many nodes of the tree greedy verification accepts: the longest path from the root
    whose tokens are truth[0], truth[1], ..."""
    node, depth = -1, 0
    while depth < len(truth):
        nxt = next((i for i, (t, p) in enumerate(zip(tokens, parents))
                    if p == node and t == truth[depth]), None)
        if nxt is None:
            break
        node, depth = nxt, depth + 1
    return depth


def tree_tokens_per_step(head: EagleHead, records: list[dict], top_k: int, depth: int,
                         budgets: list[int]) -> dict[int, float]:
    """Tokens per step of greedy decoding along each answer with EAGLE-2 trees cut to each
    budget: the tree is built at every answer row (its prefix of n nodes is the budget-n tree),
    each step's root follows from the accepted lengths."""
    steps = {b: 0 for b in budgets}
    emitted = {b: 0 for b in budgets}
    for rec in records:
        feats, tokens = rec["feats"], rec["tokens"].long()
        T, P = feats.shape[0], rec["prompt_len"]
        seq = head.new_sequence(T + depth * top_k + 8)
        seq.advance(feats[:P], tokens[1:P + 1])
        acc = {b: {} for b in budgets}
        for j in range(P - 1, T - 1):
            if j > P - 1:
                seq.advance(feats[j:j + 1], tokens[j + 1:j + 2])
            draft = seq.draft_tree(top_k, depth, max(budgets))
            truth = tokens[j + 2:j + 2 + depth].tolist()
            for b in budgets:
                acc[b][j] = tree_accepts(draft.tokens[:b], draft.parents[:b], truth)
        for b in budgets:
            s, e = eagle_ttt.walk_tokens_per_step(acc[b], P - 1, T - 1 - depth)
            steps[b] += s
            emitted[b] += e
    return {b: emitted[b] / max(steps[b], 1) for b in budgets}


def chain_tokens_per_step(head: EagleHead, records: list[dict], k: int) -> list[float]:
    """Tokens per step with chains of 1..k (from the exact chain acceptance)."""
    steps, emitted = [0] * k, [0] * k
    for rec in records:
        hits = eagle_ttt.chain_hits(head, rec, k)
        if not len(hits):
            continue
        P = rec["prompt_len"]
        for n in range(1, k + 1):
            acc = dict(zip(range(P - 1, P - 1 + len(hits)), hits[:, :n].sum(-1).tolist()))
            s, e = eagle_ttt.walk_tokens_per_step(acc, P - 1, P - 1 + len(hits))
            steps[n - 1] += s
            emitted[n - 1] += e
    return [e / max(s, 1) for s, e in zip(steps, emitted)]


def inference_agreement(head: EagleHead, records: list[dict], k: int) -> float:
    """Share of roots where the verifier's code (EagleSequence.chain) drafts the tokens the
    training-time test's forward says (a consistency check of the two code paths)."""
    same = total = 0
    for rec in records:
        feats, tokens = rec["feats"], rec["tokens"].long()
        T, P = feats.shape[0], rec["prompt_len"]
        seq = head.new_sequence(T + k + 8)
        seq.advance(feats[:P], tokens[1:P + 1])
        outs = eagle_ttt.ttt_forward(head, feats, tokens, 1)[0]
        for j in range(P - 1, T - 1):
            if j > P - 1:
                seq.advance(feats[j:j + 1], tokens[j + 1:j + 2])
            first = int(seq.chain(1)[0])
            want = int(head.target_ids(head.logits(outs[j]).argmax(-1)))
            same += first == want
            total += 1
    return same / max(total, 1)


def other_speculators(a, val: list[dict], log) -> dict:
    """The MLP speculator's and the draft's acceptance per position on the same answers, as
    scripts/train_real.py measures them, where their directories fit the target."""
    import train_real as tr
    from transformers import AutoModelForCausalLM

    from proposer_service.mlp.speculator import MLPSpeculator

    base = a.target.parent / a.target.name
    out = {}
    mlp_dir = next((d for d in (Path(f"{base}-mlp-speculator"), a.target.parent / "mlp-speculator")
                    if (d / "config.json").exists()), None)
    draft_dir = next((d for d in (Path(f"{base}-draft"), a.target.parent / "draft")
                      if (d / "config.json").exists()), None)
    for kind, recs in _kinds(val).items():
        conv = [{"hidden": r["final"], "tokens": r["tokens"],
                 "argmax": torch.cat([r["tokens"][1:], r["tokens"][-1:]]),
                 "prompt_len": r["prompt_len"]} for r in recs]
        entry = {}
        if mlp_dir is not None:
            spec = MLPSpeculator.from_pretrained(mlp_dir).float()
            entry["mlp"] = tr.mlp_acceptance(spec, tr._windows(conv, spec.config.n_predict))
        if draft_dir is not None:
            draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32)
            entry["draft"] = tr.draft_acceptance(draft, conv, 4)
        out[kind] = entry
        log(f"eval {kind}: other speculators {json.dumps(entry)}")
    out["dirs"] = {"mlp": str(mlp_dir) if mlp_dir else None,
                   "draft": str(draft_dir) if draft_dir else None}
    return out


def evaluate(a, log) -> None:
    _, target = target_tensors(a)
    head = EagleHead.from_dir(a.out, target["embed"])
    val = ed.load_records(a.work / "val")
    top_k, depth = (int(x) for x in a.tree.split(","))
    budgets = [int(b) for b in a.budgets.split(",")]
    res = {"heldout_answers": len(val), "tree": {"top_k": top_k, "depth": depth}}
    for kind, recs in _kinds(val).items():
        t0 = time.time()
        entry = {"answers": len(recs),
                 "answer_tokens": sum(len(r["tokens"]) - r["prompt_len"] for r in recs),
                 "chain_acceptance_per_position": chain_acceptance(head, recs, a.eval_k),
                 "chain_tokens_per_step": chain_tokens_per_step(head, recs, a.eval_k),
                 "tree_tokens_per_step": tree_tokens_per_step(head, recs[:a.tree_records],
                                                              top_k, depth, budgets),
                 "tree_answers": len(recs[:a.tree_records])}
        entry["inference_agreement"] = inference_agreement(head, recs[:4], a.eval_k)
        res[kind] = entry
        log(f"eval {kind} ({time.time() - t0:.0f}s): {json.dumps(entry)}")
    if not a.skip_others:
        res["others"] = other_speculators(a, val, log)
    out = Path(a.out)
    (a.work / "eval.json").write_text(json.dumps(res, indent=2) + "\n")
    (out / "eval.json").write_text(json.dumps(res, indent=2) + "\n")
    if (out / "training.json").exists():
        import eagle_card

        (out / "README.md").write_text(eagle_card.card(a, out, res))
    log(f"eval: written to {out}")
