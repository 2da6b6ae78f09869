"""Tiny learned proposers for tests, built next to the tiny target at test time.

The shipped draft and speculator are trained for models/target, which is too slow on two CPU
cores for the many requests these tests send; they run against tests/fixtures/tiny-llama
(TINY_TARGET) and make their own proposers for it: a draft that shares the target's tokenizer
(a noisy copy of the target's weights, so that some drafts are accepted and some rejected, or
an unrelated random Llama), and a randomly initialised MLP speculator for the target's hidden size.
`make_models` builds the set most tests use: a sharpened copy of the tiny target, a noisy draft
and a speculator fitted to it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

TINY_TARGET = str(Path(__file__).resolve().parent / "fixtures" / "tiny-llama")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "generation_config.json")


def copy_tokenizer(target_dir: str | Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        src = Path(target_dir) / name
        if src.is_file():
            shutil.copy(src, out / name)


def make_noisy_draft(target_dir: str | Path, out: Path, noise: float = 0.02,
                     seed: int = 1) -> Path:
    """The target's weights plus N(0, noise^2) on every matrix: agrees with it often, not always."""
    from transformers import AutoModelForCausalLM

    copy_tokenizer(target_dir, out)
    model = AutoModelForCausalLM.from_pretrained(target_dir, local_files_only=True,
                                                 dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.add_(torch.randn(p.shape, generator=gen) * noise)
    model.save_pretrained(out, safe_serialization=True)
    return out


def make_random_draft(target_dir: str | Path, out: Path, seed: int = 7) -> Path:
    """An unrelated random Llama (different size and seed) with the target's tokenizer."""
    from transformers import AutoConfig, LlamaConfig, LlamaForCausalLM

    copy_tokenizer(target_dir, out)
    tc = AutoConfig.from_pretrained(target_dir, local_files_only=True)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=tc.vocab_size, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=tc.max_position_embeddings,
                         initializer_range=0.08, bos_token_id=tc.bos_token_id,
                         eos_token_id=tc.eos_token_id, tie_word_embeddings=True)
    LlamaForCausalLM(config).save_pretrained(out, safe_serialization=True)
    return out


def make_mlp_speculator(target_dir: str | Path, out: Path, n_predict: int = 4,
                        seed: int = 0) -> Path:
    """A randomly initialised speculator for the target (fp32), recording the target's dir."""
    from transformers import AutoConfig

    from proposer_service.mlp.speculator import MLPSpeculator, MLPSpeculatorConfig

    tc = AutoConfig.from_pretrained(target_dir, local_files_only=True)
    torch.manual_seed(seed)
    spec = MLPSpeculator(MLPSpeculatorConfig(emb_dim=tc.hidden_size, vocab_size=tc.vocab_size,
                                             n_predict=n_predict,
                                             target_model=str(Path(target_dir).resolve())))
    spec.save_pretrained(out)
    return out


PROMPT_LEN = 4  # tokens of the random prompts the fitted test speculators continue


def greedy_continuations(target_dir: str | Path, seed: int, batch: int, new_tokens: int):
    """(config, target model, sequences [batch, PROMPT_LEN + new_tokens]): the target's
    greedy continuations of random prompts, what the fitted test speculators learn from."""
    from transformers import AutoConfig, AutoModelForCausalLM

    tc = AutoConfig.from_pretrained(target_dir, local_files_only=True)
    target = AutoModelForCausalLM.from_pretrained(target_dir, local_files_only=True,
                                                  dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(seed)
    start = torch.randint(2, tc.vocab_size, (batch, PROMPT_LEN), generator=gen)
    with torch.no_grad():
        seqs = target.generate(start, attention_mask=torch.ones_like(start),
                               max_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
                               eos_token_id=None)  # [B, L]
    return tc, target, seqs


def make_trained_mlp_speculator(target_dir: str | Path, out: Path, n_predict: int = 4,
                                steps: int = 60, seed: int = 0) -> Path:
    """A speculator fitted for a few seconds to the target's own greedy continuations.

    Trained on the target's final-norm hidden states as the verifier sends them (head i at
    position t sees h_t and x_{t+1..t+1+i}, predicts x_{t+2+i}), so its drafts are accepted only
    if the verifier hands over the state of the right position: an end-to-end check of the
    hidden-state contract that a random speculator cannot give.
    """

    from proposer_service.mlp.speculator import MLPSpeculator, MLPSpeculatorConfig

    tc, target, seqs = greedy_continuations(target_dir, seed, 32, 40)
    with torch.no_grad():
        hidden = target.model(seqs).last_hidden_state  # [B, L, H], after the final norm
    torch.manual_seed(seed)
    spec = MLPSpeculator(MLPSpeculatorConfig(emb_dim=tc.hidden_size, vocab_size=tc.vocab_size,
                                             n_predict=n_predict,
                                             target_model=str(Path(target_dir).resolve())))
    opt = torch.optim.AdamW(spec.parameters(), lr=3e-3)
    lo, hi = PROMPT_LEN, seqs.shape[1] - n_predict - 1
    for _ in range(steps):
        loss = sum(spec.training_losses(hidden[:, lo:hi], seqs, lo, hi))
        opt.zero_grad()
        loss.backward()
        opt.step()
    spec.eval()
    spec.save_pretrained(out)
    return out


def make_sharp_target(src: str | Path, out: Path, scale: float = 4.0) -> Path:
    """tests/fixtures/tiny-llama with its final norm scaled: logits `scale` times larger.

    The random tiny model is almost uniform over its 1024 tokens (top-1 about 1% at T=0.8), which
    leaves a distribution test no power and a draft nothing to agree on; scaled, its next-token
    distribution keeps tens of tokens, like a trained model's.
    """
    from transformers import AutoModelForCausalLM

    copy_tokenizer(src, out)
    model = AutoModelForCausalLM.from_pretrained(src, local_files_only=True, dtype=torch.float32)
    with torch.no_grad():
        model.model.norm.weight.mul_(scale)
    model.save_pretrained(out, safe_serialization=True)
    return out


def make_models(target_model_dir: str, root: Path) -> tuple[str, str, str]:
    """(target, draft, speculator) directories under root."""
    target = make_sharp_target(target_model_dir, root / "target")
    draft = make_noisy_draft(target, root / "draft", noise=0.02)
    spec = make_trained_mlp_speculator(target, root / "mlp-speculator", n_predict=4)
    return str(target), str(draft), str(spec)


def make_trained_eagle_head(target_dir: str | Path, out: Path, steps: int = 40,
                            seed: int = 0) -> Path:
    """An EAGLE-3 head fitted for a few seconds to the target's own greedy continuations, with
    the training code of `make models-eagle` (scripts/eagle_fit.py, eagle_ttt.py: two steps of
    the training-time test) on features taken from a plain forward (the inputs of layers 0, 1
    and 1 of the 2-layer target). Its drafts are accepted only where the verifier hands it the
    target's features of the right rows: an end-to-end check a random head cannot give."""
    import sys
    from types import SimpleNamespace


    scripts = str(Path(__file__).resolve().parent.parent / "scripts")
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    import eagle_fit
    import eagle_ttt

    from verifier_service.methods.eagle.checkpoint import save_eagle3
    from verifier_service.methods.eagle.head import EagleHead

    layers = [0, 1, 1]
    tc, target, seqs = greedy_continuations(target_dir, seed, 16, 28)
    with torch.no_grad():
        out_hf = target(seqs, output_hidden_states=True)
    feats = torch.cat([out_hf.hidden_states[i] for i in layers], -1)  # [B, L, 3H]
    top = out_hf.logits.float().log_softmax(-1).topk(8, dim=-1)
    records = [{"feats": feats[b, :-1], "tokens": seqs[b], "prompt_len": PROMPT_LEN,
                "top_ids": top.indices[b], "top_logp": top.values[b]}
               for b in range(seqs.shape[0])]
    cfg = tc.to_dict()
    spec = eagle_fit.head_spec(SimpleNamespace(layers=layers), cfg, tc.vocab_size)
    ids = list(range(tc.vocab_size))
    d2t, t2d, t2d_index = eagle_fit.draft_maps(ids, tc.vocab_size)
    w = {k: v.float() for k, v in target.state_dict().items()}
    embed = w["model.embed_tokens.weight"]
    params = eagle_fit.HeadParams(spec, {"embed": embed, "head": w.get("lm_head.weight", embed),
                                         "norm": w["model.norm.weight"]}, ids, seed=seed)
    opt = torch.optim.AdamW(params.parameters(), lr=3e-3)
    torch.manual_seed(seed)
    for _ in range(steps):
        head = EagleHead(spec, params.weights(d2t, t2d), embed)
        loss, weight = 0.0, 0.0
        for rec in records:
            l_, w_, _ = eagle_ttt.ttt_loss(head, rec, 2, t2d_index, 0.8, 0.1)
            loss, weight = loss + l_, weight + w_
        opt.zero_grad()
        (loss / weight).backward()
        opt.step()
    save_eagle3(out, spec, params.weights(d2t, t2d))
    return out
