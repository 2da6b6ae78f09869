"""A lean forward for Llama-family models: the model's own weights, none of the framework's
per-call machinery. Used by the draft proposer (its k sequential forwards per step) and by the
verifier's model runner (attention over the paged cache plugged in as `attend`). `hidden` takes
its positions and attention from the caller: in the verifier both come from the step's layout
(kernels/layout.py: a node's position is its depth, its mask its ancestors), so this file
computes no row offset or mask of its own there. `forward` is the draft proposer's own
left-to-right decoding over a contiguous per-sequence cache, with its causal mask.

A 1-4 M parameter draft spends most of a transformers forward in Python: module hooks, output
dataclasses, mask construction, cache objects. Drafting k tokens is k sequential forwards, so
that overhead is paid k times per step on the critical path. This runs the same arithmetic
(RMSNorm, RoPE, GQA attention via SDPA, SwiGLU MLP, tied or untied head) as plain tensor ops on
per-layer (K, V) tensors [B, H_kv, L, D], which a forward extends by concatenation (the caller's
tensors are never written, so states may share them).

Supported: model_type llama, mistral, qwen2 without sliding windows, with RoPE whose frequencies
are fixed at load time (default, linear, llama3, yarn: `LeanDecoder.supports`); anything else
uses the transformers forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels import cpu_step
from kernels.linear import PackedLinear, resolve
from kernels.rms_norm import rms_norm as _rms
from kernels.vocab_subset import SubsetHead

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [B, H_kv, L, D]

SUPPORTED_TYPES = ("llama", "mistral", "qwen2")
# RoPE variants whose frequencies (the rotary module's inv_freq, which the lean forward reads)
# and attention scaling are fixed at load time: llama3 (Llama 3.1 and 3.2) and linear rescale
# the frequencies, yarn also scales; dynamic and longrope change them with the length
STATIC_ROPE = ("default", "linear", "llama3", "yarn")


@torch.no_grad()
def _fused(projections, backend: str, invariant: bool = True) -> PackedLinear:
    """One linear computing the projections' outputs side by side (biases zero where absent).

    The projections' own weights become views of the fused matrix, so fusing holds no second
    copy of them (on an accelerator, where the dense path runs, a copy would be taken from the
    KV cache); the model's forward computes exactly what it did."""
    if len(projections) == 1:
        weight = projections[0].weight.detach()
    else:
        weight = torch.cat([p.weight.detach() for p in projections])
        start = 0
        for p in projections:
            rows = p.weight.shape[0]
            p.weight = torch.nn.Parameter(weight[start:start + rows], requires_grad=False)
            start += rows
    biases = [p.bias for p in projections]
    bias = None
    if any(b is not None for b in biases):
        bias = torch.cat([b if b is not None else p.weight.new_zeros(p.weight.shape[0])
                          for b, p in zip(biases, projections)])
    return PackedLinear(weight, bias, backend, invariant)


class LeanDecoder:
    def __init__(self, model, linear: str = "dense", vocab_subset: torch.Tensor | None = None,
                 max_positions: int | None = None, invariant: bool = True):
        """linear: the matmul backend of every projection and the head (kernels/linear.py;
        "auto" picks the fastest exact one for the weights' device and values). vocab_subset:
        token ids the head scores (kernels/vocab_subset.py; the others' logits are -inf), or
        None for the whole vocabulary. invariant: whether "auto" must keep each row's numbers
        independent of its batch (drafters need not). max_positions: the positions RoPE's
        tables cover (default: the model's max_position_embeddings), computed once on the
        weights' device so that a forward never reads a position back to the host."""
        cfg = model.config
        inner = model.get_decoder()
        self.eps = cfg.rms_norm_eps
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.scale = self.head_dim ** -0.5
        rotary = inner.rotary_emb
        self.inv_freq = rotary.inv_freq.float()
        self.rope_scale = float(getattr(rotary, "attention_scaling", 1.0))
        self.max_positions = int(max_positions or getattr(cfg, "max_position_embeddings", 0)
                                 or 4096)
        self.embed = inner.embed_tokens.weight
        self._rope_tables = self._rope_for(self.embed.dtype, self.embed.device)
        self.norm = inner.norm.weight
        head = model.get_output_embeddings().weight
        self.vocab_size = head.shape[0]  # logits per row (a subset head: the rest at -inf)
        mats = [head] + [p.weight for layer in inner.layers
                         for p in (layer.self_attn.q_proj, layer.self_attn.k_proj,
                                   layer.self_attn.v_proj, layer.self_attn.o_proj,
                                   layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj)]
        self.linear = resolve(linear, mats, invariant)
        self.head = (PackedLinear(head, None, self.linear, invariant) if vocab_subset is None
                     else SubsetHead(head, vocab_subset, self.linear, invariant))
        # q, k, v as one product and gate, up as another: fewer, wider matmuls per layer; the
        # product splits into queries and keys (rotated together) and values
        self.split_qk_v = ((self.n_heads + self.n_kv) * self.head_dim, self.n_kv * self.head_dim)
        self.layers = []
        for layer in inner.layers:
            a, m = layer.self_attn, layer.mlp
            self.layers.append((layer.input_layernorm.weight,
                                _fused((a.q_proj, a.k_proj, a.v_proj), self.linear, invariant),
                                _fused((a.o_proj,), self.linear, invariant),
                                layer.post_attention_layernorm.weight,
                                _fused((m.gate_proj, m.up_proj), self.linear, invariant),
                                _fused((m.down_proj,), self.linear, invariant)))

    def release_dense(self, model) -> None:
        """Once the products are packed (a CPU's kernels: their own copies compute), let go of
        the float32 weights of every layer's projections: the packed products' and the model's
        own (moved to the meta device). The embedding, the norms and the output head stay (a
        tied head is the embedding; an EAGLE-1/2 head scores with the target's head). Not for
        a decoder still to be sharded over tensor-parallel ranks, which reads them."""
        if self.linear == "dense":
            return  # the products compute with these very weights
        for _, qkv, o_proj, _, gate_up, down in self.layers:
            for product in (qkv, o_proj, gate_up, down):
                product.release_weight()
        for layer in model.get_decoder().layers:
            layer.self_attn.to("meta")
            layer.mlp.to("meta")

    @staticmethod
    def supports(model) -> bool:
        cfg = model.config
        rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
        return (getattr(cfg, "model_type", "") in SUPPORTED_TYPES
                and not getattr(cfg, "sliding_window", None)
                and rope.get("rope_type", "default") in STATIC_ROPE
                and getattr(cfg, "hidden_act", "silu") == "silu"
                and not getattr(cfg, "mlp_bias", False))

    def buffers(self, past: KV, batch: int, capacity: int) -> KV:
        """Preallocated caches [batch, H_kv, capacity, D] per layer holding `past` (broadcast
        over the batch) in their first columns: for forward(..., length=L) to write into."""
        out = []
        for k, v in past:
            kb = k.new_empty(batch, k.shape[1], capacity, k.shape[3])
            vb = v.new_empty(batch, v.shape[1], capacity, v.shape[3])
            kb[:, :, :k.shape[2]] = k
            vb[:, :, :v.shape[2]] = v
            out.append((kb, vb))
        return out

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, pos: torch.Tensor, past: KV | None,
                key_mask: torch.Tensor | None, keep: int,
                length: int | None = None) -> tuple[torch.Tensor, KV]:
        """ids, pos: [B, S]; past: per layer [B, H_kv, L, D] (None: empty); key_mask: [B, L + S]
        bool, which cache columns hold real tokens (None: all). Query s sits at column L + s and
        sees the real columns up to its own (and always its own). Returns the logits of the last
        `keep` queries [B, keep, V] and the cache extended by the S new columns: new tensors, or
        with `length` given, past are buffers (see `buffers`) whose first `length` columns are
        the cache: the new columns are written into them in place and views returned."""
        b, s = ids.shape
        past_len = length if length is not None else (past[0][0].shape[2] if past else 0)
        total = past_len + s
        mask = None
        if key_mask is not None or s > 1:
            cols = torch.arange(total, device=ids.device)
            qcols = cols[past_len:, None]  # [S, 1]
            allowed = cols[None, :] <= qcols  # [S, T] causal
            if key_mask is not None:
                allowed = (allowed & key_mask[:, None, :]) | (cols[None, :] == qcols)[None]
                mask = allowed[:, None]  # [B, 1, S, T]
            else:
                mask = allowed[None, None]  # [1, 1, S, T]
        new_kv: KV = []
        groups = self.n_heads // self.n_kv

        def attend(i, q, k, v):
            if length is not None:
                kb, vb = past[i]
                kb[:, :, length:total] = k
                vb[:, :, length:total] = v
                k, v = kb[:, :, :total], vb[:, :, :total]
            elif past:
                k = torch.cat([past[i][0], k], dim=2)
                v = torch.cat([past[i][1], v], dim=2)
            new_kv.append((k, v))
            att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale,
                                                 enable_gqa=groups > 1)
            return att.transpose(1, 2).reshape(b, s, -1)

        x = self.hidden(ids, pos, attend, keep)
        return self.head(x), new_kv

    def _rope_for(self, dtype: torch.dtype, device: torch.device
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin tables [max_positions, D]. The sin table's first half is negated:
        x * cos + x.roll(D / 2) * signed sin is RoPE's x * cos + rotate_half(x) * sin, bit for
        bit (-a * b == a * -b), in fewer ops."""
        freqs = torch.arange(self.max_positions, device=device).float()[:, None] \
            * self.inv_freq.to(device)  # [n, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        sign = torch.cat((-torch.ones_like(freqs), torch.ones_like(freqs)), dim=-1)
        return ((emb.cos() * self.rope_scale).to(dtype),
                (emb.sin() * self.rope_scale * sign).to(dtype))

    def _rope(self, pos: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, signed sin [B, 1, S, D] at positions pos [B, S] (< max_positions): rows of the
        tables, gathered on the device."""
        cos, sin = self._rope_tables
        if cos.dtype != dtype or cos.device != pos.device:  # a caller in another dtype
            self._rope_tables = cos, sin = self._rope_for(dtype, pos.device)
        flat = pos.reshape(-1)
        shape = (*pos.shape, cos.shape[-1])
        return (cos.index_select(0, flat).view(shape)[:, None],
                sin.index_select(0, flat).view(shape)[:, None])

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [N] -> embeddings [N, H]. A tensor-parallel rank replaces this with its
        vocabulary shard's lookup (splitspec/tensor_parallel.py)."""
        return F.embedding(ids, self.embed)

    def hidden(self, ids: torch.Tensor, pos: torch.Tensor, attend, keep: int | None = None,
               capture: tuple[int, ...] = (), captured: list | None = None,
               attend_qkv=None) -> torch.Tensor:
        """The decoder: ids, pos [B, S] -> final-norm hidden states [B, S, H] (the last `keep`
        rows only, when given). RoPE at `pos` as given (for the verifier: the layout's row
        positions). attend(layer, q [B, Hq, S, D], k, v [B, H_kv, S, D], RoPE applied) ->
        attention output [B, S, Hq * D]: the caller's cache and mask. attend_qkv(layer, qkv
        [B * S, (Hq + 2 H_kv) D], (cos, signed sin) tables [P, D]) -> [B * S, Hq * D], where
        given and the rows are float32 on a CPU, instead: the caller rotates, writes its cache
        and attends in one go (verifier_service/kv/cpu_attention.py). capture: layers whose
        residual-stream input (rows [B * S, H], every row) is appended to `captured`, in the
        order given (what heads on the target's features read, e.g. EAGLE-3's three layers)."""
        b, s = ids.shape
        # the residual stream as rows [B * S, H]: every product and norm takes it as it is
        x = self.embed_tokens(ids.reshape(-1))  # [B * S, H]
        if cpu_step.available(x):  # a CPU layer's glue in a few kernel calls
            x = self._hidden_cpu(x, pos, attend, attend_qkv, capture, captured)
        else:
            x = self._hidden_ops(x, pos, attend, capture, captured)
        x = x.view(b, s, -1)
        if keep is not None:
            x = x[:, -keep:]
        return _rms(x, self.norm, self.eps)

    def _hidden_ops(self, x, pos, attend, capture, captured) -> torch.Tensor:
        """The layers as torch operators (accelerators, other dtypes)."""
        b, s = pos.shape
        cos, sin = self._rope(pos, x.dtype)  # [B, 1, S, D], sin signed
        taken = {}
        for i, (ln1, qkv, o_proj, ln2, gate_up, down) in enumerate(self.layers):
            if i in capture:
                taken[i] = x
            h = _rms(x, ln1, self.eps)
            x = x + o_proj(self._attention(qkv(h), b, s, cos, sin, attend, i))
            h = _rms(x, ln2, self.eps)
            g, u = gate_up(h).chunk(2, dim=-1)
            x = x + down(F.silu(g) * u)
        if capture:
            captured.extend(taken[i] for i in capture)
        return x

    def _hidden_cpu(self, x, pos, attend, attend_qkv, capture, captured) -> torch.Tensor:
        """The layers with kernels/cpu_step.py's glue: each residual add fused with the norm
        after it, SiLU and the gate's product in one call, and with attend_qkv RoPE, the cache
        write and attention in the caller's two calls."""
        b, s = pos.shape
        cos = sin = None
        if attend_qkv is None:
            cos, sin = self._rope(pos, x.dtype)
        elif self._rope_tables[0].dtype != x.dtype:
            self._rope_tables = self._rope_for(x.dtype, x.device)
        taken = {}
        pending = None  # the last layer's MLP output, added with the next norm
        for i, (ln1, qkv, o_proj, ln2, gate_up, down) in enumerate(self.layers):
            x, h = cpu_step.add_rms(x, pending, ln1, self.eps)
            if i in capture:
                taken[i] = x
            if attend_qkv is not None:
                att = attend_qkv(i, qkv(h), self._rope_tables)
            else:
                att = self._attention(qkv(h), b, s, cos, sin, attend, i)
            x, h = cpu_step.add_rms(x, o_proj(att), ln2, self.eps)
            pending = down(cpu_step.silu_mul(gate_up(h)))
        if capture:
            captured.extend(taken[i] for i in capture)
        return x if pending is None else x + pending

    def _attention(self, qkv_rows, b, s, cos, sin, attend, i) -> torch.Tensor:
        """RoPE on the product's queries and keys, then the caller's attention: [B * S, Hq D]."""
        half, heads = self.head_dim // 2, (self.n_heads, self.n_kv)
        qk, v = qkv_rows.split(self.split_qk_v, dim=-1)
        # queries and keys rotated together: one RoPE over all their heads
        qk = qk.view(b, s, -1, self.head_dim).transpose(1, 2)  # [B, Hq + H_kv, S, D]
        q, k = (qk * cos + qk.roll(half, -1) * sin).split(heads, dim=1)
        v = v.view(b, s, self.n_kv, -1).transpose(1, 2)
        return attend(i, q, k, v).view(b * s, -1)
