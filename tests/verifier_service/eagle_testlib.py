"""Shared pieces of the EAGLE head tests: a tiny random target, its features taken with forward
hooks (independently of the product), random heads of both versions written as checkpoint
directories the way the published ones are, and a reference head built from transformers' own
Llama modules that recomputes every row from scratch (no cache, explicit masks)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import (
    LlamaAttention,
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
)

VOCAB, H, HEADS, KV, HEAD_DIM, INTER, LAYERS = 96, 64, 4, 2, 16, 128, 6
EPS, THETA = 1e-5, 10000.0


def tiny_target(seed: int = 0, tied: bool = False, layers: int = LAYERS) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=H, intermediate_size=INTER,
                      num_hidden_layers=layers, num_attention_heads=HEADS,
                      num_key_value_heads=KV, head_dim=HEAD_DIM, rms_norm_eps=EPS,
                      tie_word_embeddings=tied, max_position_embeddings=256)
    cfg._attn_implementation = "eager"
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # a livelier random model than the default init
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.2)
    return model


@torch.no_grad()
def target_features(model, ids: list[int], layer_ids=None) -> tuple[torch.Tensor, torch.Tensor,
                                                                   torch.Tensor]:
    """(final-norm states [T, H], the named layers' inputs concatenated [T, 3H], the target's
    greedy next token after each position [T]) for a token list, via forward pre-hooks."""
    seen = {}
    hooks = []
    for i in layer_ids or []:
        def hook(module, args, kwargs, i=i):
            seen[i] = args[0] if args else kwargs["hidden_states"]
        hooks.append(model.model.layers[i].register_forward_pre_hook(hook, with_kwargs=True))
    try:
        out = model.model(input_ids=torch.tensor([ids]))
    finally:
        for h in hooks:
            h.remove()
    final = out.last_hidden_state[0]
    aux = torch.cat([seen[i][0] for i in layer_ids], -1) if layer_ids else None
    return final, aux, model.lm_head(final).argmax(-1)


def decoder_layer(r, version: int, h: int, heads: int, kv: int, head_dim: int,
                  inter: int) -> dict[str, torch.Tensor]:
    """The head's decoder layer under its published names (EAGLE-1: layers.0.*, EAGLE-3:
    midlayer.* with q/k/v over 2H), drawn by r(*shape, s=scale); no input norm."""
    att_in = 2 * h if version == 3 else h
    layer = "midlayer." if version == 3 else "layers.0."
    return {f"{layer}self_attn.q_proj.weight": r(heads * head_dim, att_in),
            f"{layer}self_attn.k_proj.weight": r(kv * head_dim, att_in),
            f"{layer}self_attn.v_proj.weight": r(kv * head_dim, att_in),
            f"{layer}self_attn.o_proj.weight": r(h, heads * head_dim),
            f"{layer}post_attention_layernorm.weight": 1 + r(h, s=0.1),
            f"{layer}mlp.gate_proj.weight": r(inter, h),
            f"{layer}mlp.up_proj.weight": r(inter, h),
            f"{layer}mlp.down_proj.weight": r(h, inter)}


def random_weights(version: int, seed: int, draft_vocab: int = VOCAB, bias: bool = False,
                   embed: bool = False, target_hidden: int = H) -> dict[str, torch.Tensor]:
    """Tensors under the published names (EAGLE-1: layers.0.*; EAGLE-3: midlayer.*)."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape, s=0.15):
        return torch.randn(*shape, generator=g) * s

    w = decoder_layer(r, version, H, HEADS, KV, HEAD_DIM, INTER)
    w[f"{'midlayer.' if version == 3 else 'layers.0.'}input_layernorm.weight"] = 1 + r(H, s=0.1)
    if version == 3:
        w |= {"midlayer.hidden_norm.weight": 1 + r(H, s=0.1),
              "fc.weight": r(H, 3 * target_hidden, s=0.1), "norm.weight": 1 + r(H, s=0.1),
              "lm_head.weight": r(draft_vocab, H, s=0.3)}
        perm = torch.randperm(VOCAB, generator=g)[:draft_vocab].sort().values
        w["d2t"] = perm - torch.arange(draft_vocab)
        t2d = torch.zeros(VOCAB, dtype=torch.bool)
        t2d[perm] = True
        w["t2d"] = t2d
    else:
        w["fc.weight"] = r(H, 2 * H, s=0.1)
    if bias:
        w["fc.bias"] = r(H, s=0.3)
    if embed:
        w["embed_tokens.weight"] = r(VOCAB, H, s=0.5)
    return w


def config(version: int, draft_vocab: int = VOCAB, **extra) -> dict:
    """config.json as published heads have it (a one-layer Llama config; EAGLE-3 adds
    draft_vocab_size and the feature layers)."""
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H,
           "intermediate_size": INTER, "num_attention_heads": HEADS,
           "num_key_value_heads": KV, "head_dim": HEAD_DIM, "num_hidden_layers": 1,
           "hidden_act": "silu", "rms_norm_eps": EPS, "rope_theta": THETA,
           "max_position_embeddings": 2048, "vocab_size": VOCAB, "torch_dtype": "float16",
           "bos_token_id": 1, "eos_token_id": 2, "transformers_version": "4.44.0"}
    if version == 3:
        cfg |= {"architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": draft_vocab,
                "target_hidden_size": H, "tie_word_embeddings": False}
    return cfg | extra


def write_checkpoint(path: Path, cfg: dict, tensors: dict[str, torch.Tensor],
                     fmt: str = "safetensors", prefix: str = "") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    named = {prefix + k: v.contiguous() for k, v in tensors.items()}
    if fmt == "safetensors":
        save_file(named, str(path / "model.safetensors"))
    else:
        torch.save(named, path / "pytorch_model.bin")
    return path


# --------------------------------------------------------------------------- reference


class ReferenceHead:
    """The head's definition written with transformers' Llama modules, float64, no cache: every
    call recomputes all rows with an explicit mask.

        EAGLE-1  x = fc([e | f]) (+b); y = x + Attn(x); out = y + MLP(post_norm(y)); logits =
                 target_lm_head(out)
        EAGLE-3  h = fc(features) for target rows, the previous output for drafted rows;
                 x = [input_norm(e) | hidden_norm(h)]; y = h + Attn(x) (hidden_norm(h) with
                 norm_before_residual); out = y + MLP(post_norm(y));
                 logits = lm_head(norm(out)); target id = draft id + d2t[draft id]
    """

    def __init__(self, version: int, tensors: dict[str, torch.Tensor], target, cfg: dict):
        self.version = version
        t = {k.removeprefix("model.").replace("midlayer.", "layers.0."): v.double()
             if v.is_floating_point() else v for k, v in tensors.items()}
        self.t = t
        self.norm_before_residual = bool(cfg.get("norm_before_residual", False))
        att_hidden = 2 * H if version == 3 else H
        acfg = LlamaConfig(hidden_size=att_hidden, num_attention_heads=HEADS,
                           num_key_value_heads=KV, head_dim=HEAD_DIM, rms_norm_eps=EPS,
                           intermediate_size=INTER, rope_theta=cfg.get("rope_theta", THETA),
                           attention_bias="layers.0.self_attn.q_proj.bias" in t)
        acfg._attn_implementation = "eager"
        self.rotary = LlamaRotaryEmbedding(acfg)
        attn = LlamaAttention(acfg, layer_idx=0)
        attn.o_proj = torch.nn.Linear(HEADS * HEAD_DIM, H, bias=False)
        mcfg = LlamaConfig(hidden_size=H, intermediate_size=INTER)
        mlp = LlamaMLP(mcfg)
        sd = {k.removeprefix("layers.0.self_attn."): v for k, v in t.items()
              if k.startswith("layers.0.self_attn.")}
        attn.load_state_dict({k: v.float() for k, v in sd.items()})
        mlp.load_state_dict({k.removeprefix("layers.0.mlp."): v.float() for k, v in t.items()
                             if k.startswith("layers.0.mlp.")})
        self.attn, self.mlp = attn.double().eval(), mlp.double().eval()
        self.post_norm = self._norm(t["layers.0.post_attention_layernorm.weight"])
        if version == 3:
            self.input_norm = self._norm(t["layers.0.input_layernorm.weight"])
            self.hidden_norm = self._norm(t["layers.0.hidden_norm.weight"])
            self.final_norm = self._norm(t["norm.weight"])
            self.lm_head = t.get("lm_head.weight", target.lm_head.weight.detach().double())
            self.d2t = t.get("d2t")
        else:
            self.lm_head = target.lm_head.weight.detach().double()
        self.embed = (t["embed_tokens.weight"] if "embed_tokens.weight" in t
                      else target.model.embed_tokens.weight.detach().double())

    @staticmethod
    def _norm(weight):
        n = LlamaRMSNorm(weight.shape[0], eps=EPS).double()
        n.weight.data.copy_(weight)
        return n

    def fc(self, x):
        out = x.double() @ self.t["fc.weight"].T
        return out + self.t["fc.bias"] if "fc.bias" in self.t else out

    @torch.no_grad()
    def outputs(self, tokens: list[int], hidden: torch.Tensor, positions: list[int],
                allowed: torch.Tensor) -> torch.Tensor:
        """Every row's output [R, H]: row i = (tokens[i], hidden[i]) at positions[i], seeing the
        rows allowed[i] marks. hidden: the fused input for EAGLE-3, the raw f for EAGLE-1."""
        e = self.embed[torch.tensor(tokens)]
        h = hidden.double()
        if self.version == 3:
            hn = self.hidden_norm(h)
            x = torch.cat([self.input_norm(e), hn], -1)
            residual = hn if self.norm_before_residual else h
        else:
            x = self.fc(torch.cat([e, h], -1))
            residual = x
        pos = torch.tensor([positions])
        cos_sin = self.rotary(x[None], pos)
        mask = torch.zeros(len(tokens), len(tokens), dtype=torch.float64)
        mask[~allowed] = float("-inf")
        a, _ = self.attn(x[None], cos_sin, mask[None, None])
        y = residual + a[0]
        return y + self.mlp(self.post_norm(y))

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        if self.version == 3:
            out = self.final_norm(out)
        return out @ self.lm_head.T

    def target_id(self, draft_id: int) -> int:
        if self.version == 3 and self.d2t is not None:
            return draft_id + int(self.d2t[draft_id])
        return draft_id

    def chain(self, tokens: list[int], feats: torch.Tensor, k: int) -> list[int]:
        """Greedy chain after committed rows (tokens[i] = the token after position i, feats[i]
        the target's features at i): each drafted row fed back with the output before it."""
        hidden = self.fc(feats) if self.version == 3 else feats.double()
        toks, pos, rows = list(tokens), list(range(len(tokens))), hidden
        out = []
        for _ in range(k):
            n = len(toks)
            allowed = torch.ones(n, n, dtype=torch.bool).tril()
            o = self.outputs(toks, rows, pos, allowed)
            d = self.target_id(int(self.logits(o[-1]).argmax()))
            out.append(d)
            toks, pos = toks + [d], pos + [pos[-1] + 1]
            rows = torch.cat([rows, o[-1:]])
        return out

    def path_logp(self, tokens: list[int], feats: torch.Tensor, path: list[int]) -> torch.Tensor:
        """Log-probabilities over the draft vocabulary after the tree path `path` (target ids
        of drafted nodes, root's child first), each node fed with its parent's output."""
        hidden = self.fc(feats) if self.version == 3 else feats.double()
        toks, pos, rows = list(tokens), list(range(len(tokens))), hidden
        while True:
            n = len(toks)
            o = self.outputs(toks, rows, pos, torch.ones(n, n, dtype=torch.bool).tril())
            fed = n - len(tokens)
            if fed == len(path):
                return self.logits(o[-1]).log_softmax(-1)
            toks, pos = toks + [path[fed]], pos + [pos[-1] + 1]
            rows = torch.cat([rows, o[-1:]])

    def tree(self, tokens: list[int], feats: torch.Tensor, top_k: int, depth: int,
             budget: int) -> tuple[list[int], list[int], list[float]]:
        """EAGLE-2 written plainly: the root's top_k children, then each level's top_k children
        of every frontier node scored by cumulative log-probability, the best top_k of them the
        next frontier; the budget best of all candidates, best first (tree_builder.select)."""
        from proposer_service.tree_builder import reindex, select

        toks, parents, scores, paths = [], [], [], []

        def add(lp, parent):
            vals, ids = lp.topk(top_k)
            made = []
            for v, i in zip(vals.tolist(), ids.tolist()):
                t = self.target_id(i)
                base = 0.0 if parent < 0 else scores[parent]
                toks.append(t)
                parents.append(parent)
                scores.append(base + v)
                paths.append(([] if parent < 0 else paths[parent]) + [t])
                made.append(len(toks) - 1)
            return made

        frontier = add(self.path_logp(tokens, feats, []), -1)
        for _ in range(2, depth + 1):
            children = [c for f in frontier
                        for c in add(self.path_logp(tokens, feats, paths[f]), f)]
            frontier = sorted(children, key=lambda c: -scores[c])[:top_k]
        kept = select(parents, scores, budget, max_branch=len(toks))
        return (*reindex(toks, parents, kept), [scores[c] for c in kept])


PROMPT_TOKENS = [5, 17, 42, 8, 33, 61, 12, 70, 3, 25]


def eagle3_sequence(prompt: list[int], draft_vocab: int = 48, seed: int = 21):
    """An EAGLE-3 head (random weights, a permuted draft vocabulary) on a tiny target, advanced
    over the prompt: its EagleSequence."""
    return eagle3_sequences([prompt], draft_vocab, seed)[0]


def eagle3_sequences(prompts: list[list[int]], draft_vocab: int = 48, seed: int = 21):
    """eagle3_sequence for several prompts, on one head: an EagleSequence per prompt."""
    from verifier_service.methods.eagle.checkpoint import EagleSpec, EagleWeights, canonical_names
    from verifier_service.methods.eagle.head import EagleHead

    model = tiny_target(seed=seed)
    w = canonical_names(random_weights(3, seed=seed, draft_vocab=draft_vocab))
    spec = EagleSpec(3, H, HEADS, KV, HEAD_DIM, INTER, VOCAB, draft_vocab, H,
                     aux_layer_ids=(0, 2, 4))
    head = EagleHead(spec, EagleWeights(**w), model.model.embed_tokens.weight.detach())
    seqs = []
    for prompt in prompts:
        _, aux, greedy = target_features(model, prompt, [0, 2, 4])
        seq = head.new_sequence(64)
        seq.advance(aux, torch.tensor(prompt[1:] + [int(greedy[-1])]))
        seqs.append(seq)
    return seqs


def head_for_target(path: Path, target_dir: str, version: int, seed: int = 0,
                    aux_layer_ids: list[int] | None = None) -> Path:
    """A random head fitted to a target directory's shapes (its hidden size and vocabulary;
    the head's own layer as wide as the target), written as published: EAGLE-3 with the whole
    vocabulary as its draft vocabulary (d2t zero, t2d all set) and explicit feature layers."""
    t = json.loads((Path(target_dir) / "config.json").read_text())
    h, vocab = t["hidden_size"], t["vocab_size"]
    heads = t["num_attention_heads"]
    kv = t.get("num_key_value_heads") or heads
    head_dim = t.get("head_dim") or h // heads
    inter = 2 * h
    g = torch.Generator().manual_seed(seed)

    def r(*shape, s=0.15):
        return torch.randn(*shape, generator=g) * s

    w = decoder_layer(r, version, h, heads, kv, head_dim, inter)
    cfg = config(version, vocab, hidden_size=h, intermediate_size=inter,
                 num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim,
                 vocab_size=vocab)
    if version == 3:
        w |= {"midlayer.input_layernorm.weight": 1 + r(h, s=0.1),
              "midlayer.hidden_norm.weight": 1 + r(h, s=0.1),
              "fc.weight": r(h, 3 * h, s=0.1), "norm.weight": 1 + r(h, s=0.1),
              "lm_head.weight": r(vocab, h, s=0.3),
              "d2t": torch.zeros(vocab, dtype=torch.long),
              "t2d": torch.ones(vocab, dtype=torch.bool)}
        cfg |= {"target_hidden_size": h, "draft_vocab_size": vocab,
                "eagle_aux_hidden_state_layer_ids": aux_layer_ids or [0, 1, 1]}
    else:
        w["fc.weight"] = r(h, 2 * h, s=0.1)
    return write_checkpoint(path, cfg, w)


def serve_eagle_beside_plain(engine) -> tuple[list, tuple[int, int, int]]:
    """Three greedy EAGLE requests (k 4, 3 and 2) beside a plain one through the engine, at
    once: their outputs and the method's greedy (accepted, tried, drafts) afterwards; the
    engine drained."""
    import asyncio

    from engine_testlib import PROMPTS as TEXT_PROMPTS
    from engine_testlib import drained, request, run_all

    out = asyncio.run(run_all(engine, [
        request(engine, "a", TEXT_PROMPTS[0], max_tokens=16, method="eagle", k=4),
        request(engine, "b", TEXT_PROMPTS[1], max_tokens=16, method="eagle", k=3),
        request(engine, "c", TEXT_PROMPTS[2], max_tokens=16, method="eagle", k=2),
        request(engine, "plain", TEXT_PROMPTS[3], max_tokens=16, method=None)]))
    assert drained(engine)
    counts = engine.stats.method("eagle").counts().greedy
    return [t for t, _, _ in out], (counts.accepted, counts.tried, counts.drafts)


# --------------------------------------------------------------------------- speculators format


def speculators_config(cfg: dict, version: int, **extra) -> dict:
    """The speculators library's config.json for a head whose published config is `cfg`, as its
    Eagle3SpeculatorConfig / EagleSpeculatorConfig write it: the decoder layer's keys nested in
    transformer_layer_config, the algorithm and the verifier in speculators_config."""
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads",
            "num_key_value_heads", "head_dim", "num_hidden_layers", "hidden_act",
            "rms_norm_eps", "rope_theta", "rope_scaling", "max_position_embeddings")
    layer = {k: cfg[k] for k in keys if k in cfg} | {
        "model_type": "llama", "attention_bias": False, "mlp_bias": False,
        "tie_word_embeddings": False}
    kind = "eagle3" if version == 3 else "eagle"
    out = {"architectures": ["Eagle3DraftModel" if version == 3 else "EagleSpeculator"],
           "speculators_model_type": kind, "speculators_version": "0.9.0",
           "speculators_config": {
               "algorithm": kind, "default_proposal_method": "greedy",
               "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3,
                                     "verifier_accept_k": 1, "accept_tolerance": 0.0}],
               "verifier": {"name_or_path": "tiny-llama-target",
                            "architectures": ["LlamaForCausalLM"]}},
           "transformer_layer_config": layer, "torch_dtype": "float32"}
    if version == 3:
        eagle = cfg.get("eagle_config") or {}
        out |= {"draft_vocab_size": cfg.get("draft_vocab_size", cfg["vocab_size"]),
                "target_hidden_size": cfg.get("target_hidden_size"),
                "norm_before_residual": cfg.get("norm_before_residual", False),
                "eagle_aux_hidden_state_layer_ids": cfg.get(
                    "eagle_aux_hidden_state_layer_ids",
                    eagle.get("eagle_aux_hidden_state_layer_ids")),
                "norm_before_fc": False, "fc_norm": False, "norm_output": False,
                "embed_requires_grad": False}
    else:
        out |= {"transformer_layer_architecture": "LlamaDecoderLayer", "layernorms": False,
                "fusion_bias": False}
    return out | extra


def speculators_tensors(tensors: dict[str, torch.Tensor], version: int
                        ) -> dict[str, torch.Tensor]:
    """The published tensors under the speculators library's names: EAGLE-3 `layers.0.*` for
    `midlayer.*` (no d2t / t2d when the draft vocabulary is the whole one: it keeps none);
    EAGLE-1/2 `fusion_fc.*` for `fc.*` and `transformer.*` for `layers.0.*` (no input norm: its
    layer's is an identity)."""
    out = {}
    for name, t in tensors.items():
        if version == 3:
            if name in ("d2t", "t2d") and tensors["d2t"].count_nonzero() == 0 \
                    and tensors["d2t"].numel() == VOCAB:
                continue
            out[name.replace("midlayer.", "layers.0.")] = t
        elif name == "layers.0.input_layernorm.weight":
            continue
        else:
            out[name.replace("fc.", "fusion_fc.", 1) if name.startswith("fc.")
                else name.replace("layers.0.", "transformer.")] = t
    return out


def write_speculators_checkpoint(path: Path, cfg: dict, tensors: dict[str, torch.Tensor],
                                 version: int, **extra) -> Path:
    """A head written as the speculators library saves it, from its published config and
    tensors (fusion_bias set when it has an fc bias)."""
    if version == 1:
        extra = {"fusion_bias": "fc.bias" in tensors} | extra
    scfg = speculators_config(cfg, version, **extra)
    return write_checkpoint(path, scfg, speculators_tensors(tensors, version))


def speculators_head_for_target(path: Path, target_dir: str, version: int, seed: int = 0
                                ) -> Path:
    """head_for_target's head, written in the speculators format instead."""
    from safetensors.torch import load_file

    published = head_for_target(path.with_name(path.name + "-published"), target_dir, version,
                                seed)
    cfg = json.loads((published / "config.json").read_text())
    tensors = load_file(str(published / "model.safetensors"))
    return write_speculators_checkpoint(path, cfg, tensors, version)
