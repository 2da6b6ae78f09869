"""EAGLE-3's training-time test, and the acceptance it implies, for scripts/train_eagle.py.

One record (an answer with the target's features at every position, scripts/eagle_data.py) is
T = L - 1 rows: row j holds the target's features at position j and the token x_{j+1}. The head
runs `steps` times over all rows at once (`ttt_forward`), exactly as drafting would:

    step 0   row j: (x_{j+1}, fc(features_j)) at position j, causal over rows 0..j
             -> predicts x_{j+2}                                     (keys K0)
    step s   row j: (x_{j+s+1}, the row's own output of step s - 1) at position j + s, seeing
             K0 of rows 0..j and its own keys of steps 1..s only     (keys Ks, "diagonal")
             -> predicts x_{j+s+2}

which is what the head computes when it drafts s + 1 tokens from the root row j with the
target's tokens fed back (the drafted ones, whenever they were right). So one forward gives the
loss of every drafting depth on the head's own fed-back states, and, with argmax in place of the
loss, the exact greedy acceptance of every chain rooted in the answer (`chain_hits`).

The head's plain-tensor code (verifier_service/methods/eagle/head.py) is the forward; only `attend`
differs: the diagonal keys are scored one by one instead of being written to a cache.
"""

from __future__ import annotations

import torch


class DiagonalAttention:
    """`attend` for ttt_forward: step 0 is causal attention over the rows; each later step adds
    one key per row (the row's own key of that step) to the rows' causal keys of step 0."""

    def __init__(self, head, rows: int):
        self.head, self.rows = head, rows
        self.keys: list[torch.Tensor] = []  # per step [1, Hkv, T, D]
        self.values: list[torch.Tensor] = []
        self.causal = torch.ones(rows, rows, dtype=torch.bool).tril()

    def __call__(self, q, k, v):
        head = self.head
        self.keys.append(k)
        self.values.append(v)
        groups = head.spec.num_heads // head.spec.num_kv_heads
        if len(self.keys) == 1:
            return head.attention(q, k, v, self.causal[None, None])

        def rep(x):  # [1, Hkv, T, D] -> [1, Hq, T, D]
            return x.repeat_interleave(groups, 1) if groups > 1 else x

        base = (q @ rep(self.keys[0]).transpose(-1, -2)) * head.scale  # [1, Hq, T, T]
        base = base.masked_fill(~self.causal, float("-inf"))
        diag = torch.stack([(q * rep(kk)).sum(-1) for kk in self.keys[1:]], -1) * head.scale
        scores = torch.cat([base, diag], -1)  # [1, Hq, T, T + s]
        w = scores.softmax(-1, dtype=torch.promote_types(q.dtype, torch.float32)).to(q.dtype)
        out = w[..., :self.rows] @ rep(self.values[0])
        for t, vv in enumerate(self.values[1:]):
            out = out + w[..., self.rows + t, None] * rep(vv)
        return out.transpose(1, 2).reshape(1, self.rows, -1)


def ttt_forward(head, feats: torch.Tensor, tokens: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """Outputs [T, H] of every step (see the module docstring). feats [T, feature_size],
    tokens [L] (L = T + 1): the record's tokens. Rows whose step-s token would lie past the
    record repeat its last token (their predictions are never scored)."""
    T = feats.shape[0]
    attend = DiagonalAttention(head, T)
    hidden = head.hidden_from_features(feats)[None]  # [1, T, H]
    idx = torch.arange(T)
    outs = []
    for s in range(steps):
        tok = tokens[(idx + s + 1).clamp(max=len(tokens) - 1)][None]
        pos = (idx + s)[None]
        out = head.layer(tok, hidden, pos, attend)
        outs.append(out[0])
        hidden = out
    return outs


def scored_rows(T: int, step: int, lo: int) -> torch.Tensor:
    """Rows j whose step-`step` prediction (the token at j + step + 2) exists and is at or past
    position lo: j in [max(lo - step - 2, 0), T - step - 1)."""
    start = max(lo - step - 2, 0)
    return torch.arange(start, max(T - step - 1, start))


def soft_targets(top_ids: torch.Tensor, top_logp: torch.Tensor, t2d_index: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's top-K next-token distribution in draft ids: (ids [N, K] (0 where the token is
    outside the draft vocabulary), weights [N, K] (its probability, 0 outside))."""
    d = t2d_index[top_ids.long()]  # -1 outside
    p = top_logp.float().exp() * (d >= 0)
    return d.clamp(min=0), p


def ttt_loss(head, rec: dict, steps: int, t2d_index: torch.Tensor, decay: float,
             prompt_weight: float) -> tuple[torch.Tensor, float, int]:
    """(loss summed over scored rows and steps, weight it is the sum of, answer rows scored at
    step 0). Soft cross entropy against the target's own top-K distribution; step s weighs
    decay ** s; rows predicting a prompt token weigh prompt_weight (they give the head context
    practice; the answer is what gets verified)."""
    feats, tokens = rec["feats"], rec["tokens"].long()
    T, P = feats.shape[0], rec["prompt_len"]
    lo = 0 if prompt_weight > 0 else P
    outs = ttt_forward(head, feats, tokens, steps)
    total, weight, answer_rows = 0.0, 0.0, 0
    for s, out in enumerate(outs):
        rows = scored_rows(T, s, lo)
        if len(rows) == 0:
            continue
        at = rows + s + 1  # the position whose next-token distribution is the label
        ids, p = soft_targets(rec["top_ids"][at], rec["top_logp"][at], t2d_index)
        logq = head.logits(out[rows]).float().log_softmax(-1)  # [N, Vd]
        ce = -(logq.gather(1, ids) * p).sum(-1) / p.sum(-1).clamp(min=1e-6)  # [N]
        w = torch.where(at + 1 >= P, 1.0, prompt_weight) * (p.sum(-1) > 0)
        total = total + (decay ** s) * (ce * w).sum()
        weight += float((decay ** s) * w.sum())
        if s == 0:
            answer_rows = int((at + 1 >= P).sum())
    return total, weight, answer_rows


@torch.no_grad()
def chain_hits(head, rec: dict, k: int) -> torch.Tensor:
    """Greedy acceptance of the chain of k rooted at every answer row: [n_roots, k] bool, entry
    (r, i) = drafts 1..i+1 of root r all equal the target's tokens. Roots: rows j >= P - 1 (the
    first drafts the token after the first answer token) with all k tokens inside the record."""
    feats, tokens = rec["feats"], rec["tokens"].long()
    T, P = feats.shape[0], rec["prompt_len"]
    outs = ttt_forward(head, feats, tokens, k)
    roots = torch.arange(P - 1, T - k)
    if len(roots) <= 0:
        return torch.zeros(0, k, dtype=torch.bool)
    hits = []
    for s, out in enumerate(outs):
        pred = head.target_ids(head.logits(out[roots]).argmax(-1))
        hits.append(pred == tokens[roots + s + 2])
    return torch.stack(hits, -1).long().cumprod(-1).bool()


def walk_tokens_per_step(acc_len: torch.Tensor, start: int, end: int) -> tuple[int, int]:
    """Greedy decoding simulated along an answer: from root row `start`, a step accepts
    acc_len[root] drafts and emits one more token; (steps, tokens emitted) until row `end`.
    acc_len indexed by root row."""
    j, steps, emitted = start, 0, 0
    while j < end:
        n = int(acc_len[j])
        steps += 1
        emitted += n + 1
        j += n + 1
    return steps, emitted


def teacher_forced_top1(head, rec: dict) -> tuple[int, int]:
    """(right, scored) of step 0 on the answer: a cheap progress probe."""
    with torch.no_grad():
        out = ttt_forward(head, rec["feats"], rec["tokens"].long(), 1)[0]
        T, P = rec["feats"].shape[0], rec["prompt_len"]
        rows = scored_rows(T, 0, P)
        pred = head.target_ids(head.logits(out[rows]).argmax(-1))
        return int((pred == rec["tokens"].long()[rows + 2]).sum()), len(rows)
