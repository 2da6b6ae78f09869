"""Trains speculators fitted to the real chat model (SmolLM2-135M-Instruct, `make real-model`):
an MLP speculator on its hidden states and a small draft model sharing its tokenizer, both
distilled from the target's own greedy answers. `make models-real` runs it.

    python scripts/train_real.py                         # all stages in turn (make models-real
                                                         # runs data and mlp || draft in pairs)
    python scripts/train_real.py --stages mlp,eval       # later stages reuse runs/real/

Stages:
  data   prompts built locally (never a hub): chat requests from templates over Python's own
         documentation topics and module names, and code requests from the first lines of
         function docstrings in the standard library's train split (models/split.json; held-out
         files never used). Each goes through the model's chat template; the target answers
         greedily (what greedy verification accepts) and one teacher-forced pass records its final
         hidden state (after the last norm: what the verifier hands an MLP speculator) and argmax
         at every position. The first 40 prompts of each kind are held out for evaluation; a
         second round of phrasings and more docstrings follow the first round's prompts.
  freq   how often the target says each token in its training answers, ranked, into both
         speculators' token_frequencies.json (their heads may score only the most frequent
         tokens: splitspec/vocab_frequencies.py), with the held-out answers' coverage.
  mlp    MLP speculator in the accelerators' format (proposer_service/mlp/speculator.py):
         emb_dim 576 (the target's hidden size), small inner_dim so the file stays under 64 MB,
         tied weights; head i learns the target's token i + 2 ahead given its state and tokens.
  draft  small Llama sharing the tokenizer (tied embeddings initialised from a PCA projection of
         the target's), trained on the target's answers to predict the target's argmax.
  eval   per-position greedy acceptance on the held-out prompts, chat and code apart, for both
         speculators, with the whole head and with the recommended vocabulary subset ->
         models/smollm2-135m-instruct-eval.json.

One thread by default (train beside other work without starving it). Wall-clock caps per stage.
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import model_family as mf  # noqa: E402
from train_models import LMTrainConfig, lr_at, make_optimizer  # noqa: E402

REPO = mf.REPO
TARGET = REPO / "models/smollm2-135m-instruct"
MLP_OUT = REPO / "models/smollm2-135m-instruct-mlp-speculator"
DRAFT_OUT = REPO / "models/smollm2-135m-instruct-draft"
EVAL_OUT = REPO / "models/smollm2-135m-instruct-eval.json"
STAGES = ("data", "freq", "mlp", "draft", "eval")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# -- prompts -------------------------------------------------------------------------------------

CHAT_TEMPLATES = [
    "Explain the Python {topic} in simple words, with a short example.",
    "What is {topic} in Python and when should I use it?",
    "Give me three tips about {topic} in Python.",
    "What does the Python module {module} do? Answer briefly.",
    "How would you explain {module} to a beginner?",
    "Write a short note on common mistakes with {topic}.",
]
GENERAL = [
    "Tell me a fun fact about {w}.", "Write two sentences about {w}.",
    "What are the benefits of {w}?", "Describe {w} to a child.",
    "Give me a short list of ideas related to {w}.",
]
WORDS = ["rain", "mountains", "reading", "music", "coffee", "the ocean", "friendship", "bicycles",
         "gardening", "the moon", "winter", "cooking", "sleep", "libraries", "trains", "birds",
         "painting", "exercise", "volcanoes", "chess", "bread", "rivers", "clocks", "bees",
         "deserts", "photography", "history", "maps", "kindness", "recycling", "forests",
         "stars", "tea", "dogs", "writing letters", "the weather", "museums", "snow", "islands",
         "robots", "bridges", "planets", "soup", "lighthouses", "board games", "whales"]
# a second round of phrasings, appended after the first round's prompts so that the held-out
# prompts (the first of each kind) stay the ones every earlier run measured on
MORE_CHAT = [
    "I am learning Python. Can you walk me through {topic}?",
    "Summarise how {topic} works in Python in a few sentences.",
    "Show a small code example that uses the {module} module and explain it.",
    "What are the most useful functions in Python's {module} module?",
]
MORE_GENERAL = [
    "Write a short poem about {w}.", "Why do people like {w}?",
    "Give me three questions a student might ask about {w}.",
    "Explain how {w} changed over the last hundred years.", "Write a haiku about {w}.",
]


def _docstring_lines(path: Path) -> list[str]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
        return []
    out = []
    for node in ast.walk(tree):
        if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                and not node.name.startswith("_")):
            doc = ast.get_docstring(node)
            if doc:
                first = doc.strip().splitlines()[0].strip().rstrip(".")
                if 12 <= len(first) <= 90 and first[0].isupper():
                    out.append(first[0].lower() + first[1:])
    return out


def build_prompts(seed: int = 5, code_more: int = 700) -> tuple[list[str], list[str]]:
    """(chat, code) user messages; code from the stdlib train split only. The first round's
    prompts come first, in their order (the held-out ones among them); `code_more` code
    prompts and the second round of chat phrasings follow."""
    rng = random.Random(seed)
    split = json.loads((REPO / "models/split.json").read_text())
    held = set(split.get("heldout_files", []))
    root = mf.stdlib_root()
    topics = []
    try:
        from pydoc_data.topics import topics as pydoc_topics
        topics = sorted(t.replace("-", " ") for t in pydoc_topics if len(t) > 3)
    except ImportError:
        pass
    modules = sorted({p.stem for p in root.glob("*.py") if not p.stem.startswith("_")})
    chat = []
    for t in topics:
        chat.append(rng.choice(CHAT_TEMPLATES[:3] + CHAT_TEMPLATES[5:]).format(topic=t))
    for m in modules:
        chat.append(rng.choice(CHAT_TEMPLATES[3:5]).format(module=m))
    for w in WORDS:
        for tpl in GENERAL:
            chat.append(tpl.format(w=w))
    files = [p for p in sorted(root.rglob("*.py"))
             if "site-packages" not in p.parts and "test" not in p.parts
             and str(p.relative_to(root)) not in held]
    rng.shuffle(files)
    seen = set()

    def code_round(some_files):
        out = []
        for p in some_files:
            for line in _docstring_lines(p):
                if line not in seen:
                    seen.add(line)
                    out.append(f"Write a Python function that does the following: {line}.")
        return out

    first_code = code_round(files[:700])
    rng.shuffle(chat)
    rng.shuffle(first_code)
    code = first_code[: max(len(chat), 400)]
    more_code = first_code[len(code):] + code_round(files[700:])
    random.Random(seed + 1).shuffle(more_code)
    code += more_code[:code_more]
    more = [tpl.format(topic=t) for t in topics for tpl in MORE_CHAT[:2]]
    more += [tpl.format(module=m) for m in modules for tpl in MORE_CHAT[2:]]
    more += [tpl.format(w=w) for w in WORDS for tpl in MORE_GENERAL]
    random.Random(seed + 1).shuffle(more)
    first = set(chat)
    chat += [m for m in more if m not in first]
    return chat, code


# -- data ----------------------------------------------------------------------------------------

def stage_data(a) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(TARGET, local_files_only=True)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(TARGET, dtype=torch.float32).eval()
    chat, code = build_prompts()
    kinds = []
    for kind, msgs in (("chat", chat), ("code", code)):
        n_val = min(40, max(8, len(msgs) // 10))
        kinds += [(kind, "val", m) for m in msgs[:n_val]]
        kinds += [(kind, "train", m) for m in msgs[n_val:]]
    # val first (so a cap never leaves evaluation empty), then train interleaved chat/code
    val = [x for x in kinds if x[1] == "val"]
    train = [x for x in kinds if x[1] == "train"]
    random.Random(1).shuffle(train)
    order = val + train
    order = order[a.shard::a.num_shards]
    log(f"data: {len(chat)} chat and {len(code)} code prompts ({len(val)} held out)")
    records, t0, done_tokens = [], time.time(), 0
    for i in range(0, len(order), a.gen_batch):
        batch = order[i:i + a.gen_batch]
        texts = [tok.apply_chat_template([{"role": "user", "content": m}], tokenize=False,
                                         add_generation_prompt=True) for _, _, m in batch]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        tokens, hidden = _greedy_with_states(model, enc.input_ids, enc.attention_mask,
                                             a.gen_tokens)
        plen = enc.input_ids.shape[1]
        for j, (kind, part, _) in enumerate(batch):
            pad = int((enc.attention_mask[j] == 0).sum())
            s = tokens[j, pad:]
            # the target's argmax after each position: the answer itself past the prompt (greedy);
            # inside the prompt the prompt's own next token stands in for it
            records.append({"kind": kind, "part": part, "tokens": s.to(torch.int32),
                            "argmax": torch.cat([s[1:], s[-1:]]).to(torch.int32),
                            "hidden": hidden[j, pad:].to(torch.float16),
                            "prompt_len": plen - pad})
        done_tokens += len(batch) * a.gen_tokens
        log(f"data: {len(records)} answers, {done_tokens} generated tokens, "
            f"{done_tokens / (time.time() - t0):.0f} tok/s")
        trained = sum(r["part"] == "train" for r in records)
        if time.time() - t0 > a.data_minutes * 60 and trained >= 16:
            log(f"data: wall-clock cap of {a.data_minutes} min reached")
            break
    a.work.mkdir(parents=True, exist_ok=True)
    torch.save(records, a.work / f"data-{a.shard}.pt")
    log(f"data: saved {len(records)} records in {(time.time() - t0) / 60:.1f} min")


@torch.no_grad()
def _greedy_with_states(model, ids, mask, n_new: int):
    """Greedy decoding that keeps the final-norm hidden state of every position (what the verifier
    hands an MLP speculator) without a second pass: tokens [B, P + n], hidden [B, P + n - 1, H]
    (the last token's state is never needed: nothing is predicted from it here)."""
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    out = model.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
    states = [out.last_hidden_state]
    toks = [ids]
    for step in range(n_new):
        nxt = model.lm_head(out.last_hidden_state[:, -1]).argmax(-1, keepdim=True)  # [B, 1]
        toks.append(nxt)
        if step == n_new - 1:
            break
        mask = torch.cat([mask, torch.ones_like(nxt)], 1)
        pos = pos[:, -1:] + 1
        out = model.model(input_ids=nxt, attention_mask=mask, position_ids=pos,
                          past_key_values=out.past_key_values, use_cache=True)
        states.append(out.last_hidden_state)
    return torch.cat(toks, 1), torch.cat(states, 1)


def load_records(a, part: str) -> list[dict]:
    files = sorted(a.work.glob("data*.pt"))
    return [r for f in files for r in torch.load(f) if r["part"] == part]


# -- token frequencies ---------------------------------------------------------------------------

def _answer_tokens(r: dict) -> list[int]:
    return r["tokens"][r["prompt_len"]:].tolist()


def stage_freq(a) -> None:
    """How often the target says each token in its own training answers, ranked, written next to
    both speculators (token_frequencies.json, read by --vocab-subset: an output head scoring the
    most frequent tokens only), with how much of the held-out answers the top N cover."""
    from splitspec.vocab_frequencies import FREQUENCIES, write_frequencies

    counts = Counter(t for r in load_records(a, "train") for t in _answer_tokens(r))
    ranked = sorted(counts, key=lambda t: (-counts[t], t))
    val = load_records(a, "val")
    coverage = {}
    for kind in ("chat", "code"):
        held = [t for r in val if r["kind"] == kind for t in _answer_tokens(r)]
        coverage[kind] = {n: round(sum(t in set(ranked[:n]) for t in held) / max(len(held), 1), 4)
                          for n in (1024, 2048, 4096, 8192, 16384)}
    log(f"freq: {len(counts)} distinct tokens in {sum(counts.values())}; held-out coverage "
        f"{coverage}")
    for out in (MLP_OUT, DRAFT_OUT):
        out.mkdir(parents=True, exist_ok=True)
        write_frequencies(out / FREQUENCIES, counts,
                          "the target's greedy answers to the training prompts "
                          "(scripts/train_real.py, stage freq)",
                          recommended_subset=min(a.vocab_subset, len(counts)) or None,
                          heldout_coverage=coverage)


# -- MLP speculator ------------------------------------------------------------------------------

def _windows(records, n: int, gen_only: bool = True):
    """Per record (h [L, H], tokens [L], argmax [L], lo): positions t in [lo, L - n - 1) train,
    lo = prompt_len - 1 (the state that picks the first answer token onwards)."""
    out = []
    for r in records:
        lo = r["prompt_len"] - 1 if gen_only else 0
        if len(r["tokens"]) - n - 1 > lo:
            out.append((r["hidden"], r["tokens"].long(), r["argmax"].long(), lo))
    return out


def _update(opt, loss, params, name: str, step: int, t0: float) -> None:
    """One optimiser step on `loss` (gradient norm clipped to 1), logged every 10 steps."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    if step % 10 == 0:
        per_step = (time.time() - t0) / (step + 1)
        log(f"{name} step {step} loss {loss.item():.3f} {per_step:.2f}s/step")


@dataclass
class Fit:
    steps: int  # optimiser steps done
    minutes: float
    seen: int  # training units seen (positions or tokens)
    acceptance: list[float]  # held-out, per position, at the end
    history: list[dict]


def _fit(name: str, model, a, weight_decay: float, batch_loss, evaluate, unit: str) -> Fit:
    """The loop both speculators train with, on the options --NAME-lr, -steps, -batch and
    -minutes: the schedule's learning rate, one batch's loss (`batch_loss() -> (loss, units
    seen)`), an optimiser step; `evaluate(final)` every --eval-every steps and at the end."""
    opts = {k: getattr(a, f"{name}_{k}") for k in ("lr", "steps", "batch", "minutes")}
    opt = make_optimizer(model, opts["lr"], weight_decay)
    sched = LMTrainConfig(steps=opts["steps"], batch_size=opts["batch"], seq_len=0,
                          lr=opts["lr"], warmup=30, minutes=opts["minutes"])
    eval_every = a.eval_every
    t0, history, seen, step = time.time(), [], 0, 0
    for step in range(sched.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, sched, time.time() - t0)
        loss, n = batch_loss()
        seen += n
        _update(opt, loss, model.parameters(), name, step, t0)
        if (step + 1) % eval_every == 0:
            acc = evaluate(False)
            history.append({"step": step + 1, f"{unit}_seen": seen, "acceptance": acc})
            log(f"{name} eval step {step + 1} ({seen} {unit}): {[round(x, 3) for x in acc]}")
        if time.time() - t0 > sched.minutes * 60:
            log(f"{name}: wall-clock cap of {sched.minutes} min reached at step {step + 1}")
            break
    acc = evaluate(True)
    history.append({"step": step + 1, f"{unit}_seen": seen, "acceptance": acc})
    return Fit(step + 1, (time.time() - t0) / 60, seen, acc, history)


def stage_mlp(a) -> None:
    from transformers import AutoTokenizer

    from proposer_service.mlp.speculator import MLPSpeculator, MLPSpeculatorConfig

    tok = AutoTokenizer.from_pretrained(TARGET, local_files_only=True)
    tcfg = json.loads((TARGET / "config.json").read_text())
    cfg = MLPSpeculatorConfig(
        emb_dim=tcfg["hidden_size"], inner_dim=a.mlp_inner_dim, vocab_size=tcfg["vocab_size"],
        n_predict=a.mlp_n_predict, tie_weights=True, scale_input=True,
        target_model="SmolLM2-135M-Instruct (models/smollm2-135m-instruct)",
        target_vocab_fingerprint=mf.vocab_fingerprint(tok))
    train = _windows(load_records(a, "train"), cfg.n_predict)
    val = _windows(load_records(a, "val"), cfg.n_predict)
    torch.manual_seed(0)
    spec = MLPSpeculator(cfg)
    n_params = sum(p.numel() for p in spec.parameters())
    log(f"mlp: {n_params / 1e6:.2f} M params, {len(train)} train / {len(val)} val answers")
    rng = random.Random(3)

    def batch_loss():
        total, weight = 0.0, 0
        for h, s, g, lo in rng.sample(train, min(a.mlp_batch, len(train))):
            hi = len(s) - cfg.n_predict - 1
            losses = spec.training_losses(h[None, lo:hi].float(), s[None], lo, hi, g[None])
            w = hi - lo
            total = total + sum(losses) * w
            weight += w
        return total / weight, weight

    fit = _fit("mlp", spec, a, 0.0, batch_loss, lambda final: mlp_acceptance(spec, val),
               "positions")
    spec.to(torch.float16).save_pretrained(MLP_OUT)
    (MLP_OUT / "training.json").write_text(json.dumps({
        "params": n_params, "steps_done": fit.steps, "train_minutes": fit.minutes,
        "positions_seen": fit.seen, "train_answers": len(train), "config": asdict(cfg),
        "data": "the target's greedy answers to locally built chat and code prompts "
                "(scripts/train_real.py); labels = the target's argmax",
        "val_acceptance_per_position_greedy": fit.acceptance, "history": fit.history,
        "lr": a.mlp_lr}, indent=2) + "\n")
    log(f"mlp saved: held-out per-position acceptance {[round(x, 3) for x in fit.acceptance]}")


def copy_tokenizer(out: Path) -> None:
    """The target's own tokenizer files, byte for byte: the launcher matches a draft to its
    target by them (splitspec/methods.py)."""
    import shutil

    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                 "special_tokens_map.json"):
        if (TARGET / name).exists():
            shutil.copyfile(TARGET / name, out / name)


def _target_embedding() -> torch.Tensor:
    from safetensors.torch import load_file

    w = load_file(str(TARGET / "model.safetensors"))
    key = next(k for k in w if k.endswith("embed_tokens.weight"))
    return w[key].float()


def _pca(x: torch.Tensor, dim: int) -> torch.Tensor:
    """[H, dim] projection onto x's top principal directions."""
    xc = x - x.mean(0, keepdim=True)
    _, _, v = torch.pca_lowrank(xc, q=dim, center=False)
    return v[:, :dim]


@torch.no_grad()
def mlp_acceptance(spec, windows, mask: torch.Tensor | None = None) -> list[float]:
    """Greedy acceptance per position: the chain drafted from the true state and accepted
    tokens is accepted at position i iff heads 0..i all match the target's argmax. mask [V]:
    added to the logits (-inf outside a vocabulary subset), None for the whole head."""
    spec.eval()
    n = spec.config.n_predict
    ok, total = torch.zeros(n), 0
    for h, s, g, lo in windows:
        hi = len(s) - n - 1
        logits = spec.teacher_forced_logits(h[None, lo:hi].float(), s[None], lo, hi)
        if mask is not None:
            logits = [lg + mask for lg in logits]
        hits = torch.stack([lg[0].argmax(-1) == g[lo + 1 + i: hi + 1 + i]
                            for i, lg in enumerate(logits)], -1)  # [T, n]
        ok += hits.long().cumprod(-1).sum(0)
        total += hi - lo
    spec.train()
    return (ok / max(total, 1)).tolist()


# -- draft model ---------------------------------------------------------------------------------

def stage_draft(a) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    tcfg = json.loads((TARGET / "config.json").read_text())
    cfg = LlamaConfig(vocab_size=tcfg["vocab_size"], hidden_size=a.draft_hidden,
                      intermediate_size=a.draft_hidden * 3, num_hidden_layers=a.draft_layers,
                      num_attention_heads=a.draft_hidden // 64,
                      num_key_value_heads=a.draft_hidden // 64,
                      max_position_embeddings=tcfg.get("max_position_embeddings", 2048),
                      rope_theta=tcfg.get("rope_theta", 10000.0), tie_word_embeddings=True,
                      bos_token_id=tcfg.get("bos_token_id"), eos_token_id=tcfg.get("eos_token_id"),
                      rms_norm_eps=tcfg.get("rms_norm_eps", 1e-5))
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        emb = _target_embedding()
        e = emb @ _pca(emb, a.draft_hidden)
        model.model.embed_tokens.weight.copy_(e / e.std() * 0.02 * 4)
    n_params = mf.count_params(model)
    train, val = load_records(a, "train"), load_records(a, "val")
    log(f"draft: {n_params / 1e6:.2f} M params, {len(train)} train answers")
    rng = random.Random(4)

    def batch_loss():
        batch = rng.sample(train, min(a.draft_batch, len(train)))
        loss_sum, n_tok = 0.0, 0
        for r in batch:  # one sequence at a time: lengths differ, no padding waste
            s, g, lo = r["tokens"].long(), r["argmax"].long(), r["prompt_len"] - 1
            logits = model(input_ids=s[None, :-1]).logits[0]  # [L - 1, V]
            # every position learns the target's argmax (the prompt's too, half weight)
            w = torch.ones(len(s) - 1)
            w[:lo] = 0.5
            ce = F.cross_entropy(logits, g[:-1], reduction="none")
            loss_sum = loss_sum + (ce * w).sum()
            n_tok += float(w.sum())
        return loss_sum / n_tok, sum(len(r["tokens"]) for r in batch)

    def evaluate(final: bool) -> list[float]:
        acc = draft_acceptance(model, val if final else val[::5], a.eval_k)  # chat and code
        model.train()
        return acc

    model.train()
    fit = _fit("draft", model, a, 0.1, batch_loss, evaluate, "tokens")
    model.to(torch.float16).save_pretrained(DRAFT_OUT, safe_serialization=True)
    copy_tokenizer(DRAFT_OUT)
    (DRAFT_OUT / "training.json").write_text(json.dumps({
        "params": n_params, "steps_done": fit.steps, "train_minutes": fit.minutes,
        "tokens_seen": fit.seen, "train_answers": len(train),
        "size": {"hidden": a.draft_hidden, "layers": a.draft_layers},
        "init": "tied embedding = PCA projection of the target's embedding",
        "data": "the target's greedy answers (scripts/train_real.py); labels = the target's argmax",
        "val_acceptance_per_position_greedy": fit.acceptance, "history": fit.history,
        "lr": a.draft_lr}, indent=2) + "\n")
    log(f"draft saved: held-out per-position acceptance {[round(x, 3) for x in fit.acceptance]}")


@torch.no_grad()
def draft_acceptance(model, records, k: int, mask: torch.Tensor | None = None) -> list[float]:
    """Greedy acceptance per position on held-out answers: at each answer position t, the draft
    continues greedily from the true prefix for k tokens; position i is accepted iff drafts
    0..i all equal the target's argmax chain (which is the answer itself). mask: as in
    mlp_acceptance."""
    model.eval()
    ok, total = torch.zeros(k), 0
    for r in records:
        s = r["tokens"].long()
        lo = r["prompt_len"]
        for t in range(lo, len(s) - k, 4):  # every 4th position: cheap and unbiased
            ids = s[None, :t]
            out = model(input_ids=ids, use_cache=True)
            drafts = []
            for _ in range(k):
                nxt = (out.logits[0, -1] if mask is None else out.logits[0, -1] + mask).argmax()
                drafts.append(int(nxt))
                out = model(input_ids=nxt.view(1, 1), past_key_values=out.past_key_values,
                            use_cache=True)
            hits = torch.tensor([d == int(x) for d, x in zip(drafts, s[t:t + k])])
            ok += hits.long().cumprod(0)
            total += 1
    return (ok / max(total, 1)).tolist()


# -- evaluation ----------------------------------------------------------------------------------

def stage_eval(a) -> None:
    from transformers import AutoModelForCausalLM

    from proposer_service.mlp.speculator import MLPSpeculator
    from splitspec.vocab_frequencies import resolve_subset

    val = load_records(a, "val")
    out = {"target": "SmolLM2-135M-Instruct", "held_out_answers": len(val)}
    vocab = json.loads((TARGET / "config.json").read_text())["vocab_size"]
    subsets = {}  # name -> mask over the vocabulary (the recommended FR-Spec subset)
    for name, d in (("mlp", MLP_OUT), ("draft", DRAFT_OUT)):
        ids = resolve_subset(d, "auto", vocab) if d.exists() else None
        if ids is not None:
            subsets[name] = torch.full((vocab,), float("-inf")).index_fill_(0, ids, 0.0)
            out[f"{name}_vocab_subset"] = len(ids)
    for kind in ("chat", "code"):
        part = [r for r in val if r["kind"] == kind]
        entry = {"answers": len(part)}
        if (MLP_OUT / "config.json").exists():
            spec = MLPSpeculator.from_pretrained(MLP_OUT).float()
            windows = _windows(part, spec.config.n_predict)
            entry["mlp_acceptance_per_position"] = mlp_acceptance(spec, windows)
            if "mlp" in subsets:
                entry["mlp_acceptance_per_position_subset"] = mlp_acceptance(
                    spec, windows, subsets["mlp"])
        if (DRAFT_OUT / "config.json").exists():
            draft = AutoModelForCausalLM.from_pretrained(DRAFT_OUT, dtype=torch.float32)
            entry["draft_acceptance_per_position"] = draft_acceptance(draft, part, a.eval_k)
            if "draft" in subsets:
                entry["draft_acceptance_per_position_subset"] = draft_acceptance(
                    draft, part, a.eval_k, subsets["draft"])
        out[kind] = entry
        log(f"eval {kind}: {entry}")
    EVAL_OUT.write_text(json.dumps(out, indent=2) + "\n")
    for name, d in (("mlp", MLP_OUT), ("draft", DRAFT_OUT)):
        if (d / "training.json").exists():
            (d / "README.md").write_text(model_card(name, d, out))


CARD_WHAT = {
    "mlp": ("MLP speculator", "an MLP speculator in the accelerators' `mlp_speculator` format "
            "(arXiv 2404.19124; loads in vLLM and TGI too): conditioned on the target's final "
            "hidden state, head i drafts the token i + 2 ahead", "positions"),
    "draft": ("draft model", "a small Llama sharing the target's tokenizer byte for byte, "
              "distilled from the target's own answers", "tokens"),
}


def model_card(name: str, d: Path, ev: dict) -> str:
    """The directory's README.md: what it is, how it was trained, held-out acceptance."""
    title, what, unit = CARD_WHAT[name]
    lead = what[0].upper() + what[1:]
    tr = json.loads((d / "training.json").read_text())
    rows = []
    for kind in ("chat", "code"):
        e = ev.get(kind, {})
        for head, key in (("whole head", f"{name}_acceptance_per_position"),
                          (f"{ev.get(f'{name}_vocab_subset')}-token subset",
                           f"{name}_acceptance_per_position_subset")):
            if key in e:
                rows.append(f"| {kind} ({e['answers']} answers) | {head} | "
                            + " ".join(f"{x:.2f}" for x in e[key]) + " |")
    curve = [f"| {h[f'{unit}_seen']} | {h['acceptance'][0]:.2f} |" for h in tr["history"]]
    freq = json.loads((d / "token_frequencies.json").read_text()) \
        if (d / "token_frequencies.json").exists() else None
    subset = "" if freq is None else (
        f"\n`token_frequencies.json` ranks the {len(freq['ranked_ids'])} tokens the target said "
        f"in its {freq['counted_tokens']} training answer tokens; the proposer's head scores the "
        f"{freq['recommended_subset']} most frequent by default (`--vocab-subset`, "
        "splitspec/vocab_frequencies.py). Held-out coverage by the top N, chat / code: "
        + ", ".join(f"{n}: {freq['heldout_coverage']['chat'][n]:.3f} / "
                    f"{freq['heldout_coverage']['code'][n]:.3f}"
                    for n in freq["heldout_coverage"]["chat"]) + ".\n")
    return f"""# SmolLM2-135M-Instruct {title}

{lead}, fitted to SmolLM2-135M-Instruct (`make real-model`) for splitspec's `{name}`
proposer. {tr['params'] / 1e6:.1f} M parameters, fp16 safetensors. Written by
`scripts/train_real.py` (`make models-real` reproduces it on a 2-core CPU); every number below is
in `training.json` and `../smollm2-135m-instruct-eval.json`.

## Training

Data: {tr['data']}. {tr['train_answers']} training answers; 40 chat and 40 code prompts held out
by prompt. {tr['steps_done']} AdamW steps (lr {tr['lr']}), {tr['train_minutes']:.0f} minutes on
one thread, {tr[f'{unit}_seen']} {unit} seen.

## Held-out greedy acceptance per position

Position i counts as accepted when the first i drafts all equal the target's tokens, drafted from
the true prefix.

| prompts | head | positions 1.. |
|---|---|---|
{chr(10).join(rows)}
{subset}
## Acceptance at the first position against training {unit} seen

{"The MLP speculator's points are on all held-out answers." if name == "mlp" else
"Every point but the last on every fifth held-out answer (16, chat and code), the last on all."}

| {unit} seen | acceptance |
|---:|---:|
{chr(10).join(curve)}
"""


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stages", default=",".join(STAGES))
    p.add_argument("--work", type=Path, default=REPO / "runs/real")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--gen-batch", type=int, default=32)
    p.add_argument("--shard", type=int, default=0, help="data: this process's share of prompts")
    p.add_argument("--num-shards", type=int, default=1)
    p.add_argument("--gen-tokens", type=int, default=96)
    p.add_argument("--data-minutes", type=float, default=34)
    p.add_argument("--mlp-inner-dim", type=int, default=256)
    p.add_argument("--mlp-n-predict", type=int, default=3)
    p.add_argument("--draft-hidden", type=int, default=256)
    p.add_argument("--draft-layers", type=int, default=4)
    for model, lr, minutes in (("mlp", 1e-3, 45), ("draft", 2e-3, 45)):  # each model's schedule
        p.add_argument(f"--{model}-lr", type=float, default=lr)
        p.add_argument(f"--{model}-steps", type=int, default=3000)
        p.add_argument(f"--{model}-batch", type=int, default=8)
        p.add_argument(f"--{model}-minutes", type=float, default=minutes)
    p.add_argument("--eval-every", type=int, default=40)
    p.add_argument("--eval-k", type=int, default=4)
    p.add_argument("--vocab-subset", type=int, default=8192,
                   help="freq: the subset size recorded as the speculators' default (0: none)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    if not (TARGET / "config.json").exists():
        raise SystemExit(f"{TARGET} is missing: run `make real-model` first")
    mf.run_stages(p, a.stages, STAGES, {s: globals()[f"stage_{s}"] for s in STAGES}, a, log)


if __name__ == "__main__":
    main()
