"""MLP speculator: a multi-head, recurrent MLP that drafts tokens from the target's hidden state.

The architecture follows the design IBM published for fms-extras ("Accelerating Production LLMs
with Combined Token/Embedding Speculators", arXiv 2404.19124). Head ``i`` keeps a running state:

    s_0   = LN0(h_t) / sqrt(2)                         # h_t: target's final hidden state [B, H]
    # x_{t+1}: the token the target just emitted
    s_i+1 = GELU(LN_i(W_i s_i * a + E_i[x_{t+1+i}] * b))
    logits_i = U_i s_i+1                               # predicts x_{t+2+i}

with ``a = 0.5 ** (0.5 / n_predict)`` and ``b = sqrt((1 - a^2) * inner_dim / 2)`` so that, in
expectation, the target's state still makes up about half of the state magnitude at the last head
(the LayerNorm removes the common scale, which is why only the ratio b / a is applied).

At inference the greedy path feeds each head's argmax into the next head. With ``tie_weights``
the embedding, LayerNorm, output head and (from head 1 on) the projection are shared, which keeps
the file small and lets the recurrence run past ``n_predict`` steps (the extra steps reuse the
shared head; quality decays with depth, so callers should prefer k <= n_predict).

The module is self-contained (torch + safetensors) so that the proposer service can import it.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
MODEL_TYPE = "mlp_speculator"


@dataclass
class MLPSpeculatorConfig:
    emb_dim: int  # the target's hidden size (size of the state handed over by the verifier)
    vocab_size: int  # must equal the target's vocabulary size
    inner_dim: int = 0  # width of the running state; 0 means emb_dim
    n_predict: int = 4  # number of trained heads (tokens drafted per step)
    tie_weights: bool = True  # share emb/ln/head across heads, proj across heads >= 1
    scale_input: bool = True  # parameter-free LayerNorm on the incoming target state
    target_model: str = ""  # which target it was trained on (a path or name, informational)
    target_vocab_fingerprint: str = ""  # sha256 of the target tokenizer's vocabulary
    dtype: str = "float16"  # dtype of the stored weights

    def __post_init__(self) -> None:
        if self.inner_dim == 0:
            self.inner_dim = self.emb_dim

    def to_dict(self) -> dict:
        return {"model_type": MODEL_TYPE, **asdict(self)}

    @classmethod
    def from_dict(cls, d: dict) -> "MLPSpeculatorConfig":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


class MLPSpeculator(nn.Module):
    def __init__(self, config: MLPSpeculatorConfig):
        super().__init__()
        self.config = c = config
        n_emb = n_ln = n_head = 1 if c.tie_weights else c.n_predict
        # proj[0] maps emb_dim -> inner_dim; the rest inner_dim -> inner_dim (shared when tied)
        n_proj_rest = 1 if c.tie_weights else c.n_predict - 1
        self.emb = nn.ModuleList(nn.Embedding(c.vocab_size, c.inner_dim) for _ in range(n_emb))
        self.proj = nn.ModuleList(
            [nn.Linear(c.emb_dim, c.inner_dim, bias=False)]
            + [nn.Linear(c.inner_dim, c.inner_dim, bias=False) for _ in range(max(n_proj_rest, 0))]
        )
        self.ln = nn.ModuleList(nn.LayerNorm(c.inner_dim) for _ in range(n_ln))
        self.head = nn.ModuleList(
            nn.Linear(c.inner_dim, c.vocab_size, bias=False) for _ in range(n_head)
        )
        self.state_weight = 0.5 ** (0.5 / c.n_predict)
        self.emb_weight = math.sqrt((1 - self.state_weight**2) * (c.inner_dim / 2))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        c = self.config
        for e in self.emb:
            nn.init.normal_(e.weight, 0.0, 1.0 / math.sqrt(c.inner_dim))
        for p in self.proj:
            nn.init.normal_(p.weight, 0.0, 1.0 / math.sqrt(p.in_features))
        for h in self.head:
            nn.init.normal_(h.weight, 0.0, 1.0 / math.sqrt(c.inner_dim))
        for ln in self.ln:
            nn.init.ones_(ln.weight)
            nn.init.zeros_(ln.bias)

    # head i -> index into the (possibly shared) module lists; steps past n_predict reuse the last
    # one
    def _idx(self, i: int, n: int) -> int:
        return min(i, n - 1)

    def _proj_idx(self, i: int) -> int:
        return 0 if i == 0 else min(i, len(self.proj) - 1)

    @property
    def max_steps(self) -> int:
        """How many tokens one call can draft (unbounded recurrence when tied; capped at 8 by
        convention)."""
        return max(self.config.n_predict, 8) if self.config.tie_weights else self.config.n_predict

    def input_state(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.config.scale_input:
            # parameter-free LN, then 1/sqrt(2) as in the reference design
            hidden = F.layer_norm(hidden, hidden.shape[-1:]) / math.sqrt(2)
        return hidden

    def step(
        self, state: torch.Tensor, token: torch.Tensor, i: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One head: state [..., D_in], token [...] -> (new state [..., inner], logits [..., V])."""
        z = self.emb[self._idx(i, len(self.emb))](token)
        s = self.proj[self._proj_idx(i)](state)
        # state_weight * s + emb_weight * z; the LayerNorm cancels the common factor state_weight
        s = s + z * (self.emb_weight / self.state_weight)
        s = F.gelu(self.ln[self._idx(i, len(self.ln))](s))
        return s, self.head[self._idx(i, len(self.head))](s)

    def forward(self, hidden: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits of every head.

        hidden: [B, T, H] target states at positions t; tokens: [B, T, n] where tokens[..., i] is
        x_{t+1+i} (the token head i conditions on). Returns [n, B, T, V]: head i predicts x_{t+2+i}.
        """
        state = self.input_state(hidden)
        out = []
        for i in range(tokens.shape[-1]):
            state, logits = self.step(state, tokens[..., i], i)
            out.append(logits)
        return torch.stack(out, 0)

    # ---- training helpers (sequence layout: s [B, L] tokens, h [B, T, H] states at positions
    # lo..hi-1)

    def teacher_forced_logits(
        self, h: torch.Tensor, s: torch.Tensor, lo: int, hi: int
    ) -> list[torch.Tensor]:
        n = self.config.n_predict
        toks = torch.stack([s[:, lo + 1 + i : hi + 1 + i] for i in range(n)], -1)  # [B, T, n]
        return list(self.forward(h, toks))

    def training_losses(
        self,
        h: torch.Tensor,
        s: torch.Tensor,
        lo: int,
        hi: int,
        next_tokens: torch.Tensor | None = None,
    ) -> list[torch.Tensor]:
        """Per-head cross entropy over positions t in [lo, hi).

        Head i at t conditions on s[t+1..t+1+i]. Its label is next_tokens[t+1+i] when given (e.g.
        the target's own argmax after the prefix s[:t+2+i], which is what greedy verification
        accepts), else the next token of the sequence, s[t+2+i].
        """
        losses = []
        for i, lg in enumerate(self.teacher_forced_logits(h, s, lo, hi)):
            y = (
                s[:, lo + 2 + i : hi + 2 + i]
                if next_tokens is None
                else next_tokens[:, lo + 1 + i : hi + 1 + i]
            )
            losses.append(F.cross_entropy(lg.float().reshape(-1, lg.size(-1)), y.reshape(-1)))
        return losses

    # ---- inference

    @torch.no_grad()
    def generate_suggestions(
        self, hidden: torch.Tensor, last_token: torch.Tensor, k: int | None = None
    ) -> torch.Tensor:
        """Greedy draft. hidden [B, H] (target state that produced last_token), last_token [B] ->
        [B, k]."""
        k = self.config.n_predict if k is None else k
        if k > self.max_steps:
            raise ValueError(f"k={k} exceeds what this speculator can draft ({self.max_steps})")
        state = self.input_state(hidden.to(self.head[0].weight.dtype))
        tok = last_token
        out = []
        for i in range(k):
            state, logits = self.step(state, tok, i)
            tok = logits.argmax(-1)
            out.append(tok)
        return torch.stack(out, -1)

    @torch.no_grad()
    def sample_suggestions(
        self,
        hidden: torch.Tensor,
        last_token: torch.Tensor,
        k: int | None = None,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sampled draft. Returns (tokens [B, k], probs [B, k, V]): the exact q each token was
        drawn from."""
        k = self.config.n_predict if k is None else k
        if k > self.max_steps:
            raise ValueError(f"k={k} exceeds what this speculator can draft ({self.max_steps})")
        state = self.input_state(hidden.to(self.head[0].weight.dtype))
        tok = last_token
        toks, probs = [], []
        for i in range(k):
            state, logits = self.step(state, tok, i)
            q = torch.softmax(logits.float() / max(temperature, 1e-6), -1)
            tok = torch.multinomial(q, 1, generator=generator).squeeze(-1)
            toks.append(tok)
            probs.append(q)
        return torch.stack(toks, -1), torch.stack(probs, 1)

    # ---- persistence

    def save_pretrained(self, path: str | Path) -> None:
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        dtype = next(self.parameters()).dtype
        self.config.dtype = str(dtype).removeprefix("torch.")
        state = {k: v.detach().contiguous() for k, v in self.state_dict().items()}
        save_file(state, str(path / WEIGHTS_NAME), metadata={"format": "pt"})
        (path / CONFIG_NAME).write_text(json.dumps(self.config.to_dict(), indent=2) + "\n")

    @classmethod
    def from_pretrained(
        cls, path: str | Path, dtype: torch.dtype | None = None, device: str | torch.device = "cpu"
    ) -> "MLPSpeculator":
        from safetensors.torch import load_file

        path = Path(path)
        raw = json.loads((path / CONFIG_NAME).read_text())
        if raw.get("model_type", MODEL_TYPE) != MODEL_TYPE:
            raise ValueError(
                f"{path} is not an {MODEL_TYPE} checkpoint (model_type={raw.get('model_type')!r})"
            )
        config = MLPSpeculatorConfig.from_dict(raw)
        model = cls(config)
        state = load_file(str(path / WEIGHTS_NAME))
        model.load_state_dict(state, strict=True)
        model.to(device=device, dtype=dtype or getattr(torch, config.dtype))
        model.eval()
        return model
