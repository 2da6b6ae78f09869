"""Trains the shipped model family (tokenizer, target, draft, MLP speculator) from the stdlib
corpus.

Runs end to end on a CPU with only the pinned dependencies:

    python scripts/train_models.py                      # all stages, writes models/
    # one stage (earlier stages' outputs must exist)
    python scripts/train_models.py --stages target

Stages (in order):
  tokenizer  byte-level BPE on the train split -> models/{target,draft}/tokenizer files
  data       token streams of both splits -> <work>/data/{train,heldout}.bin (uint16)
  target     Llama causal LM trained on the corpus (next-token cross entropy)
  distill    the target's greedy continuations of train-split prompts -> <work>/data/distill.pt
  draft      small Llama trained on corpus + target continuations, with the target's soft targets
  mlp        MLP speculator trained on the frozen target's final hidden states and greedy tokens,
             stored in the accelerators' mlp_speculator format (proposer_service/mlp/speculator.py)

Everything is trained in fp32 and stored as fp16 safetensors. Seeds are fixed; the split is by
file. Wall-clock caps (--*-minutes) stop a stage early if the machine is slower than expected,
which is the one source of run-to-run difference besides thread-level float nondeterminism.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, astuple, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import model_family as mf  # noqa: E402

STAGES = ("tokenizer", "data", "target", "distill", "draft", "mlp")
DEFAULT_MINUTES = (
    55 + 6 + 18
)  # target + distill + (draft || mlp) caps; tokenizer and data take ~1 min


@dataclass
class LMTrainConfig:
    steps: int
    batch_size: int  # sequences per optimiser step
    seq_len: int  # tokens per sequence (the model sees seq_len, predicts seq_len)
    lr: float
    warmup: int = 50
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    minutes: float = 60.0  # wall-clock cap; the schedule is by step, the cap only truncates
    eval_every: int = 100
    seed: int = 0


@dataclass
class TrainArgs:
    out: Path
    work: Path
    vocab_size: int = 4096
    threads: int = 2
    target_size: mf.LlamaSize = mf.TARGET_SIZE
    target_init: Path | None = None  # continue training this checkpoint instead of a fresh model
    draft_size: mf.LlamaSize = mf.DRAFT_SIZE
    corpus: mf.CorpusConfig = field(default_factory=mf.CorpusConfig)
    target: LMTrainConfig = field(
        default_factory=lambda: LMTrainConfig(
            steps=1700, batch_size=4, seq_len=512, lr=2e-3, minutes=55
        )
    )
    draft: LMTrainConfig = field(
        default_factory=lambda: LMTrainConfig(
            steps=1500, batch_size=8, seq_len=512, lr=3e-3, minutes=13
        )
    )
    # weight of KL(target || draft) in the draft loss; 0 = plain cross entropy (no target forward,
    # so ~4x more tokens in the same time); the target's continuations are in every batch either way
    draft_kd: float = 0.0
    draft_distill_share: float = (
        0.25  # share of each draft batch taken from the target's continuations
    )
    # distillation data: target greedy continuations
    distill_prompts: int = 1536
    distill_prompt_len: int = 64
    distill_gen_len: int = 128
    distill_minutes: float = 6.0
    # mlp speculator
    mlp_n_predict: int = 5
    mlp_inner_dim: int = 0  # 0 -> emb_dim
    mlp_tie_weights: bool = True
    mlp_steps: int = 1200
    mlp_lr: float = 2e-3
    mlp_batch: int = 8  # sequences of target continuations per step
    mlp_minutes: float = 18.0
    mlp_corpus_windows: int = 2048  # teacher-forced train windows added to the continuations
    mlp_cache_minutes: float = 4.0  # cap on the target forward passes that cache states


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def lr_at(step: int, cfg: LMTrainConfig, elapsed_s: float = 0.0) -> float:
    """Linear warmup, then cosine decay. Progress is by step or by wall clock, whichever is further,
    so a run on a slow or shared machine still anneals before its --minutes cap stops it."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t_step = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    t = min(1.0, max(t_step, elapsed_s / (cfg.minutes * 60)))
    # cosine from lr down to lr * min_lr_ratio
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def make_optimizer(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    # no weight decay on norms / 1-d params
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )


def random_windows(
    stream: np.ndarray, batch: int, length: int, rng: np.random.Generator
) -> torch.Tensor:
    starts = rng.integers(0, len(stream) - length - 1, size=batch)
    return torch.from_numpy(np.stack([stream[s : s + length + 1] for s in starts]).astype(np.int64))


def save_hf(model, tokenizer, out: Path, meta: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    half = model.to(torch.float16)
    half.config.dtype = torch.float16
    half.save_pretrained(str(out), safe_serialization=True)
    model.to(torch.float32)
    mf.save_tokenizer(tokenizer, out)
    (out / "training.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")


# --------------------------------------------------------------------------- stages


def stage_tokenizer(a: TrainArgs) -> None:
    train_files, held_files = mf.split_files(a.corpus)
    log(
        f"corpus: {len(train_files)} train files, {len(held_files)} held-out files "
        f"from {mf.stdlib_root()}"
    )
    texts = mf.read_texts(train_files)
    t0 = time.time()
    tok = mf.wrap_tokenizer(mf.train_tokenizer(texts, a.vocab_size))
    log(
        f"tokenizer: vocab {len(tok)} in {time.time() - t0:.0f}s, "
        f"fingerprint {mf.vocab_fingerprint(tok)[:16]}"
    )
    tok_dir = a.work / "tokenizer"
    mf.save_tokenizer(tok, tok_dir)
    manifest = json.dumps(mf.split_manifest(a.corpus), indent=1) + "\n"
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "split.json").write_text(
        manifest
    )  # shipped: lets a rerun check it reproduces the split


def stage_data(a: TrainArgs) -> None:
    tok = mf.load_tokenizer(a.work / "tokenizer")
    train_files, held_files = mf.split_files(a.corpus)
    (a.work / "data").mkdir(parents=True, exist_ok=True)
    for name, files in (("train", train_files), ("heldout", held_files)):
        texts = mf.read_texts(files)
        ids = mf.encode_stream(tok, texts)
        ids.tofile(a.work / "data" / f"{name}.bin")
        nbytes = sum(len(t.encode()) for t in texts)
        log(
            f"data: {name} {len(texts)} files, {nbytes / 1e6:.1f} MB -> "
            f"{len(ids) / 1e6:.2f} M tokens "
            f"({nbytes / len(ids):.2f} bytes/token)"
        )


def load_stream(a: TrainArgs, name: str) -> np.ndarray:
    return np.fromfile(a.work / "data" / f"{name}.bin", dtype=np.uint16)


def train_lm(
    model,
    cfg: LMTrainConfig,
    train: np.ndarray,
    val: torch.Tensor,
    tag: str,
    teacher=None,
    distill_seqs: torch.Tensor | None = None,
    kd_weight: float = 0.0,
    distill_share: float = 0.5,
    distill_sep: int = 0,
) -> dict:
    """AdamW + cosine LM training. With a teacher, the loss mixes CE and KL(teacher || student).

    distill_seqs [N, L]: extra sequences (target continuations); distill_share of each batch comes
    from them. They are joined into one stream (separated by distill_sep, the document separator)
    and cut into seq_len windows like the corpus, so every row trains every position up to seq_len.
    """
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    distill_stream = None
    if distill_seqs is not None:
        sep = torch.full((len(distill_seqs), 1), distill_sep, dtype=distill_seqs.dtype)
        distill_stream = torch.cat([distill_seqs, sep], 1).reshape(-1).numpy()
    opt = make_optimizer(model, cfg.lr, cfg.weight_decay)
    model.train()
    t0 = time.time()
    tokens = 0
    hist = []
    step = 0
    for step in range(cfg.steps):
        lr = lr_at(step, cfg, time.time() - t0)
        for g in opt.param_groups:
            g["lr"] = lr
        if distill_stream is not None:
            nb = max(1, int(round(cfg.batch_size * distill_share)))
            batch = torch.cat(
                [
                    random_windows(train, cfg.batch_size - nb, cfg.seq_len, rng),
                    random_windows(distill_stream, nb, cfg.seq_len, rng),
                ],
                0,
            )
        else:
            batch = random_windows(train, cfg.batch_size, cfg.seq_len, rng)
        x, y = batch[:, :-1], batch[:, 1:]
        logits = model(input_ids=x).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        if teacher is not None and kd_weight > 0:
            with torch.no_grad():
                t_logp = F.log_softmax(teacher(input_ids=x).logits.float(), -1)
            s_logp = F.log_softmax(logits, -1)
            # KL(p_teacher || p_student), averaged per token
            kl = (t_logp.exp() * (t_logp - s_logp)).sum(-1).mean()
            loss = (1 - kd_weight) * loss + kd_weight * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        tokens += x.numel()
        elapsed = time.time() - t0
        if step % 10 == 0:
            log(
                f"{tag} step {step}/{cfg.steps} loss {loss.item():.3f} lr {lr:.2e} "
                f"{tokens / max(elapsed, 1e-6):.0f} tok/s"
            )
        if (step + 1) % cfg.eval_every == 0:
            vl = mf.lm_loss(model, val)
            hist.append(
                {"step": step + 1, "tokens": tokens, "heldout_loss": vl, "minutes": elapsed / 60}
            )
            log(f"{tag} eval step {step + 1}: held-out loss {vl:.3f} (ppl {math.exp(vl):.1f})")
        if elapsed > cfg.minutes * 60:
            log(f"{tag}: wall-clock cap of {cfg.minutes} min reached at step {step + 1}")
            break
    vl = mf.lm_loss(model, val)
    return {
        "steps_done": step + 1,
        "tokens_seen": tokens,
        "train_minutes": (time.time() - t0) / 60,
        "final_heldout_loss_sample": vl,
        "history": hist,
        "config": asdict(cfg),
    }


def stage_target(a: TrainArgs) -> None:
    from transformers import LlamaForCausalLM

    tok = mf.load_tokenizer(a.work / "tokenizer")
    torch.manual_seed(a.target.seed)
    prev = None
    if a.target_init is not None:  # continue an earlier run: its weights, a fresh warmup + cosine
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(
            str(a.target_init), local_files_only=True, dtype=torch.float32
        )
        if mf.vocab_fingerprint(mf.load_tokenizer(a.target_init)) != mf.vocab_fingerprint(tok):
            raise SystemExit(f"{a.target_init} was trained with another tokenizer")
        prev = json.loads((Path(a.target_init) / "training.json").read_text())
        a.target.seed += prev["steps_done"]  # other batches than the run it continues
        log(
            f"target: continuing {a.target_init} after {prev['steps_done']} steps, "
            f"{prev['tokens_seen'] / 1e6:.2f} M tokens"
        )
    else:
        model = LlamaForCausalLM(mf.llama_config(a.target_size, tok))
    n = mf.count_params(model)
    size = {k: getattr(model.config, k) for k in asdict(a.target_size)}
    log(f"target: {n / 1e6:.2f} M params, {size}")
    train, held = load_stream(a, "train"), load_stream(a, "heldout")
    val = mf.fixed_windows(held, 16, a.target.seq_len)
    stats = train_lm(model, a.target, train, val, "target")
    if prev is not None:  # totals over the whole lineage; each run's own record in "runs"
        runs = prev.get(
            "runs", [{k: prev[k] for k in ("steps_done", "tokens_seen", "train_minutes", "config")}]
        )
        runs.append({k: stats[k] for k in ("steps_done", "tokens_seen", "train_minutes", "config")})
        stats["runs"] = runs
        before = {
            k: sum(r[k] for r in runs[:-1]) for k in ("steps_done", "tokens_seen", "train_minutes")
        }
        stats["history"] = prev.get("history", []) + [
            {
                **h,
                "step": h["step"] + before["steps_done"],
                "tokens": h["tokens"] + before["tokens_seen"],
                "minutes": h["minutes"] + before["train_minutes"],
            }
            for h in stats["history"]
        ]
        for k in ("steps_done", "tokens_seen", "train_minutes"):
            stats[k] = sum(r[k] for r in runs)
    stats.update(params=n, size=size, vocab_fingerprint=mf.vocab_fingerprint(tok))
    save_hf(model, tok, a.out / "target", stats)
    log(f"target saved: held-out loss {stats['final_heldout_loss_sample']:.3f}")


def load_target(a: TrainArgs):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(
        str(a.out / "target"), local_files_only=True, dtype=torch.float32
    )
    m.eval()
    for p in m.parameters():
        p.requires_grad_(False)
    return m


def stage_distill(a: TrainArgs) -> None:
    """Target greedy continuations of train-split prompts: the data the proposers are scored on."""
    target = load_target(a)
    train = load_stream(a, "train")
    rng = np.random.default_rng(7)
    t0 = time.time()
    seqs = []
    bs = 64
    for i in range(0, a.distill_prompts, bs):
        prompts = random_windows(
            train, min(bs, a.distill_prompts - i), a.distill_prompt_len - 1, rng
        )
        seqs.append(mf.greedy_continue(target, prompts, a.distill_gen_len))
        log(f"distill: {sum(len(s) for s in seqs)} continuations, {time.time() - t0:.0f}s")
        if time.time() - t0 > a.distill_minutes * 60:
            break
    seqs = torch.cat(seqs, 0)
    torch.save(
        {"seqs": seqs.to(torch.int16), "prompt_len": a.distill_prompt_len},
        a.work / "data" / "distill.pt",
    )
    log(f"distill: saved {tuple(seqs.shape)}")


def load_distill(a: TrainArgs) -> tuple[torch.Tensor, int]:
    d = torch.load(a.work / "data" / "distill.pt")
    return d["seqs"].to(torch.int64), d["prompt_len"]


def stage_draft(a: TrainArgs) -> None:
    from transformers import LlamaForCausalLM

    tok = mf.load_tokenizer(a.out / "target")
    target = load_target(a) if a.draft_kd > 0 else None
    torch.manual_seed(a.draft.seed)
    model = LlamaForCausalLM(mf.llama_config(a.draft_size, tok))
    n = mf.count_params(model)
    log(f"draft: {n / 1e6:.2f} M params, {asdict(a.draft_size)}")
    train, held = load_stream(a, "train"), load_stream(a, "heldout")
    seqs = None
    if a.draft_distill_share > 0 and (a.work / "data" / "distill.pt").exists():
        seqs, _ = load_distill(a)
    val = mf.fixed_windows(held, 16, a.draft.seq_len)
    stats = train_lm(
        model,
        a.draft,
        train,
        val,
        "draft",
        teacher=target,
        distill_seqs=seqs,
        kd_weight=a.draft_kd,
        distill_share=a.draft_distill_share,
        distill_sep=tok.convert_tokens_to_ids(mf.EOS),
    )
    stats.update(
        params=n,
        size=asdict(a.draft_size),
        vocab_fingerprint=mf.vocab_fingerprint(tok),
        data="corpus windows + target greedy continuations "
        f"({a.draft_distill_share:.0%} of each batch)"
        if seqs is not None
        else "corpus windows",
        loss=f"{1 - a.draft_kd:g} CE + {a.draft_kd:g} KL(target||draft)",
    )
    save_hf(model, tok, a.out / "draft", stats)
    log(f"draft saved: held-out loss {stats['final_heldout_loss_sample']:.3f}")


def stage_mlp(a: TrainArgs) -> None:
    from proposer_service.mlp.speculator import MLPSpeculator, MLPSpeculatorConfig

    target = load_target(a)
    seqs, prompt_len = load_distill(a)
    H = target.config.hidden_size
    cfg = MLPSpeculatorConfig(
        emb_dim=H,
        inner_dim=a.mlp_inner_dim or H,
        vocab_size=target.config.vocab_size,
        n_predict=a.mlp_n_predict,
        tie_weights=a.mlp_tie_weights,
        scale_input=True,
        target_model="models/target",
        target_vocab_fingerprint=mf.vocab_fingerprint(mf.load_tokenizer(a.out / "target")),
    )
    # Training sequences: the target's greedy continuations plus teacher-forced corpus windows. For
    # each we keep the target's final hidden states h and its argmax next tokens g (g[j] = the token
    # the target emits after s[:j+1]); head i at t conditions on s[t+1..t+1+i] and learns g[t+1+i].
    # On a continuation g[j] == s[j+1]; on corpus text g is what greedy verification would accept.
    n = cfg.n_predict
    rng = np.random.default_rng(3)
    train_stream = load_stream(a, "train")
    L = seqs.size(1)
    n_corpus = a.mlp_corpus_windows
    corpus = random_windows(train_stream, n_corpus, L - 1, rng) if n_corpus else seqs[:0]
    all_seqs = torch.cat([seqs, corpus], 0)
    is_gen = torch.cat(
        [torch.ones(len(seqs), dtype=torch.bool), torch.zeros(len(corpus), dtype=torch.bool)]
    )
    t0 = time.time()
    states, greedy = [], []
    with torch.no_grad():
        for i in range(0, len(all_seqs), 32):
            # final-norm output of the target = the state the verifier hands over
            h = target.model(input_ids=all_seqs[i : i + 32]).last_hidden_state
            greedy.append(target.lm_head(h).argmax(-1))
            states.append(h.to(torch.float16))
            if time.time() - t0 > a.mlp_cache_minutes * 60:
                log(f"mlp: state caching cap of {a.mlp_cache_minutes} min reached")
                break
    states, greedy = torch.cat(states, 0), torch.cat(greedy, 0)
    all_seqs, is_gen = all_seqs[: len(states)], is_gen[: len(states)]
    # continuations: only positions past the prompt; corpus windows: every position
    lo_gen, lo_cor, hi = prompt_len - 1, 0, L - n - 1
    log(
        f"mlp: cached target states {tuple(states.shape)} ({int(is_gen.sum())} continuations, "
        f"{int((~is_gen).sum())} corpus windows) in {time.time() - t0:.0f}s"
    )
    del target
    gen_idx = torch.nonzero(is_gen).squeeze(1)
    cor_idx = torch.nonzero(~is_gen).squeeze(1)
    n_val_gen = max(8, len(gen_idx) // 10)
    val_idx, gen_train = gen_idx[:n_val_gen], gen_idx[n_val_gen:]

    torch.manual_seed(0)
    spec = MLPSpeculator(cfg)
    n_params = sum(p.numel() for p in spec.parameters())
    log(f"mlp: {n_params / 1e6:.2f} M params, {asdict(cfg)}")
    opt = make_optimizer(spec, a.mlp_lr, 0.0)
    sched = LMTrainConfig(
        steps=a.mlp_steps,
        batch_size=a.mlp_batch,
        seq_len=0,
        lr=a.mlp_lr,
        warmup=50,
        minutes=a.mlp_minutes,
    )
    t0 = time.time()
    hist = []
    step = 0
    positions = 0
    n_gen_b = (
        a.mlp_batch // 2
        if len(gen_train) and len(cor_idx)
        else (a.mlp_batch if len(gen_train) else 0)
    )
    for step in range(a.mlp_steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, sched, time.time() - t0)
        losses = None
        parts = []
        if n_gen_b:
            parts.append(
                (gen_train[torch.from_numpy(rng.integers(0, len(gen_train), size=n_gen_b))], lo_gen)
            )
        if a.mlp_batch - n_gen_b:
            parts.append(
                (
                    cor_idx[
                        torch.from_numpy(rng.integers(0, len(cor_idx), size=a.mlp_batch - n_gen_b))
                    ],
                    lo_cor,
                )
            )
        for idx, lo in parts:
            part = spec.training_losses(
                states[idx, lo:hi].float(), all_seqs[idx], lo, hi, greedy[idx]
            )
            w = len(idx) * (hi - lo)
            positions += w
            part = [head_loss * w for head_loss in part]
            losses = part if losses is None else [x + y for x, y in zip(losses, part)]
        total_w = sum(len(idx) * (hi - lo) for idx, lo in parts)
        losses = [head_loss / total_w for head_loss in losses]
        loss = sum(losses)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(spec.parameters(), 1.0)
        opt.step()
        if step % 10 == 0:
            log(
                f"mlp step {step}/{a.mlp_steps} "
                f"losses {[round(head_loss.item(), 3) for head_loss in losses]} "
                f"{(time.time() - t0) / (step + 1):.2f}s/step"
            )
        if (step + 1) % 100 == 0:
            acc = mlp_accuracy(spec, states[val_idx], all_seqs[val_idx], lo_gen, hi)
            hist.append({"step": step + 1, "head_top1": acc})
            log(f"mlp eval step {step + 1}: per-head top-1 {[round(x, 3) for x in acc]}")
        if time.time() - t0 > a.mlp_minutes * 60:
            log(f"mlp: wall-clock cap of {a.mlp_minutes} min reached at step {step + 1}")
            break
    acc = mlp_accuracy(spec, states[val_idx], all_seqs[val_idx], lo_gen, hi)
    log(
        "mlp final per-head top-1 (teacher-forced, held-back continuations) "
        f"{[round(x, 3) for x in acc]}"
    )
    out = a.out / "mlp-speculator"
    spec.to(torch.float16).save_pretrained(out)
    (out / "training.json").write_text(
        json.dumps(
            {
                "params": n_params,
                "steps_done": step + 1,
                "train_minutes": (time.time() - t0) / 60,
                "continuations": len(gen_train),
                "corpus_windows": len(cor_idx),
                "window_tokens": L,
                "batch_sequences": a.mlp_batch,
                "positions_seen": positions,
                "format": "mlp_speculator (IBM accelerator layout: RMS-style norms with a learned "
                "scale and shift, scale-free ln0)",
                "data": "half target greedy continuations of train-split prompts "
                "(prompt %d + %d generated tokens), "
                "half teacher-forced train-split windows; labels = the target's argmax next tokens"
                % (prompt_len, L - prompt_len),
                "val_head_top1_teacher_forced": acc,
                "history": hist,
                "lr": a.mlp_lr,
            },
            indent=2,
        )
        + "\n"
    )
    log("mlp saved")


@torch.no_grad()
def mlp_accuracy(spec, states: torch.Tensor, seqs: torch.Tensor, lo: int, hi: int) -> list[float]:
    """Teacher-forced top-1 accuracy of each head on held-back continuations."""
    spec.eval()
    correct = torch.zeros(spec.config.n_predict)
    total = 0
    for i in range(0, len(seqs), 16):
        h, s = states[i : i + 16, lo:hi].float(), seqs[i : i + 16]
        for j, lg in enumerate(spec.teacher_forced_logits(h, s, lo, hi)):
            correct[j] += (lg.argmax(-1) == s[:, lo + 2 + j : hi + 2 + j]).sum()
        total += h.shape[0] * h.shape[1]
    spec.train()
    return (correct / total).tolist()


# --<model>-<flag> -> (LMTrainConfig field, type, help)
LM_FLAGS = {
    "steps": ("steps", int, "optimiser steps of the schedule"),
    "minutes": ("minutes", float, "wall-clock cap"),
    "batch": ("batch_size", int, "sequences per optimiser step"),
    "lr": ("lr", float, "peak learning rate"),
    "warmup": ("warmup", int, "linear warmup steps"),
}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--stages", default=",".join(STAGES), help=f"comma list out of {STAGES}")
    p.add_argument("--out", type=Path, default=mf.REPO / "models")
    p.add_argument(
        "--work", type=Path, default=mf.REPO / "runs" / "models", help="scratch dir (data, logs)"
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--vocab-size", type=int, default=4096)
    for model in ("target", "draft"):  # the LMTrainConfig fields a run may override, per model
        for flag, (attr, typ, what) in LM_FLAGS.items():
            p.add_argument(
                f"--{model}-{flag}", type=typ, dest=f"{model}_{attr}", help=f"{model}: {what}"
            )
    p.add_argument(
        "--target-init",
        type=Path,
        help="continue training this target checkpoint (e.g. models/target) for another schedule",
    )
    p.add_argument(
        "--draft-kd", type=float, help="weight of the KL-to-target term in the draft loss"
    )
    p.add_argument(
        "--draft-distill-share",
        type=float,
        help="share of each draft batch taken from the target's continuations (0: corpus only)",
    )
    p.add_argument("--mlp-steps", type=int)
    p.add_argument("--mlp-minutes", type=float)
    p.add_argument("--mlp-corpus-windows", type=int)
    p.add_argument(
        "--mlp-cache-minutes", type=float, help="cap on caching the target's states for the mlp"
    )
    p.add_argument("--distill-prompts", type=int)
    p.add_argument("--distill-minutes", type=float)
    p.add_argument(
        "--minutes",
        type=float,
        help="overall wall-clock budget; scales every stage cap "
        f"(default total {DEFAULT_MINUTES:g})",
    )
    p.add_argument(
        "--target-size",
        type=parse_size,
        help="hidden,layers,heads,intermediate (default %s)"
        % ",".join(map(str, astuple(mf.TARGET_SIZE)[:4])),
    )
    p.add_argument(
        "--draft-size",
        type=parse_size,
        help="hidden,layers,heads,intermediate (default %s)"
        % ",".join(map(str, astuple(mf.DRAFT_SIZE)[:4])),
    )
    p.add_argument(
        "--sequential",
        action="store_true",
        help="train draft and mlp one after the other "
        "(default: at once, threads split between them)",
    )
    ns = p.parse_args(argv)
    a = TrainArgs(out=ns.out, work=ns.work, vocab_size=ns.vocab_size, threads=ns.threads)
    if ns.minutes is not None:
        f = ns.minutes / DEFAULT_MINUTES
        a.target.minutes *= f
        a.draft.minutes *= f
        a.mlp_minutes *= f
        a.distill_minutes *= f
    a.target_size = ns.target_size or a.target_size
    a.target_init = ns.target_init
    a.draft_size = ns.draft_size or a.draft_size
    for model in ("target", "draft"):
        for attr, _, _ in LM_FLAGS.values():
            if (val := getattr(ns, f"{model}_{attr}")) is not None:
                setattr(getattr(a, model), attr, val)
    for attr, val in (
        ("draft_kd", ns.draft_kd),
        ("draft_distill_share", ns.draft_distill_share),
        ("mlp_steps", ns.mlp_steps),
        ("mlp_minutes", ns.mlp_minutes),
        ("mlp_corpus_windows", ns.mlp_corpus_windows),
        ("mlp_cache_minutes", ns.mlp_cache_minutes),
        ("distill_prompts", ns.distill_prompts),
        ("distill_minutes", ns.distill_minutes),
    ):
        if val is not None:
            setattr(a, attr, val)
    mf.set_threads(a.threads)
    a.work.mkdir(parents=True, exist_ok=True)
    stages = [s.strip() for s in ns.stages.split(",") if s.strip()]
    for s in stages:
        if s not in STAGES:
            p.error(f"unknown stage {s!r}")
    parallel = not ns.sequential and "draft" in stages and "mlp" in stages
    for s in STAGES:
        if parallel and s in ("draft", "mlp"):
            if s == "draft":
                run_parallel(["draft", "mlp"], argv if argv is not None else sys.argv[1:], a)
            continue
        if s in stages:
            t0 = time.time()
            log(f"=== stage {s}")
            globals()[f"stage_{s}"](a)
            log(f"=== stage {s} done in {(time.time() - t0) / 60:.1f} min")


def parse_size(text: str) -> mf.LlamaSize:
    hidden, layers, heads, inter = (int(x) for x in text.split(","))
    return mf.LlamaSize(hidden, layers, heads, inter)


def run_parallel(stages: list[str], argv: list[str], a: TrainArgs) -> None:
    """Runs independent stages as child processes at once, splitting the threads between them
    (small models use two cores poorly; two 1-thread jobs finish sooner than two 2-thread ones)."""
    import subprocess

    base, skip = [], False
    for tok in argv:  # drop --stages / --threads, both "--x v" and "--x=v" forms
        if skip:
            skip = False
            continue
        if tok in ("--stages", "--threads"):
            skip = True
            continue
        if tok.startswith(("--stages=", "--threads=")):
            continue
        base.append(tok)
    threads = max(1, a.threads // len(stages))
    t0 = time.time()
    procs = []
    for s in stages:
        logf = open(a.work / f"train_{s}.log", "w")
        cmd = [sys.executable, __file__, *base, "--stages", s, "--threads", str(threads)]
        log(f"=== stage {s} in the background ({threads} thread(s)), log {logf.name}")
        procs.append((s, subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT), logf))
    for s, proc, logf in procs:
        rc = proc.wait()
        logf.close()
        if rc:
            raise SystemExit(f"stage {s} failed (exit {rc}); see {logf.name}")
    log(f"=== stages {stages} done in {(time.time() - t0) / 60:.1f} min")


if __name__ == "__main__":
    main()
