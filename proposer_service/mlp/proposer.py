"""MLP speculator proposer: drafts from the target's last hidden state, no KV cache of its own.

The verifier includes, for every sequence assigned to this proposer, the target's final-norm
hidden state h at the position that produced the sequence's last token x (it asks for it because
Info says needs_hidden_state). The speculator (proposer_service/mlp/speculator.py) runs its
heads recurrently from (h, x): head i conditions on the token drafted by head i-1. Per sequence
the session keeps only the token history (for x and the wire contract's consistency check).

It loads checkpoints in the accelerators' mlp_speculator format (IBM's `*-accelerator`
checkpoints as vLLM and TGI load them, and the project's own models/mlp-speculator); a checkpoint
that records no target needs the target's tokenizer passed explicitly.

All sequences of a step run as one batch [B, H]. Up to min(k, n_predict) tokens are drafted per
sequence (the trained heads; deeper recurrence reuses the shared head and decays quickly).
A chain step (max_branch 1) gets the top-1 path of the format's candidate tree (one token per
head): greedy requests get argmax drafts (token ids only); sampled requests get tokens sampled
from the top-K-truncated q = apply_sampling_params(head logits, the request's params), sent with
exactly that sparse q, as in the draft-model proposer (proposer_service/sampling.py).

A tree step (max_branch > 1) gets the format's candidate tree (MLPSpeculator.generate_tree): each
head expands every kept node by its top max_branch tokens, at most k nodes kept best-first by
cumulative log-probability. Its nodes are deterministic (token ids only, one-hot q) for sampled
requests too, which is simple and lossless: the tree sampler accepts a node with the target's
probability of it and tries the next sibling on the target with that token removed, so siblings
together are accepted with the target's mass on all of them. Siblings sampled without replacement
(each sent with its conditioned q) would be lossless as well; only acceptance differs: more when
the head's q is close to the target's p, less when it is not. Seeded requests accept the node
equal to the keyed choice, as with every deterministic draft.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from kernels.linear import pack_linears
from kernels.sampling import draw_exponentials, key_halves
from kernels.sparse_probs import SparseProbs
from proposer_service.base import (
    HistoryStore,
    Proposer,
    ProposerSession,
    draft_in_batches,
    load_learned,
)
from proposer_service.mlp.speculator import CONFIG_NAME, MLPSpeculator, MLPSpeculatorConfig
from proposer_service.sampling import (
    DraftChooser,
    choose_static,
    draft_keys,
    logit_offsets,
    sparse_row,
)
from splitspec.device import HostFetch
from splitspec.device import to_device as _to
from splitspec.graphs import EagerFallbacks, Replay
from splitspec.proposal import Draft, ProposerDescription, SequenceStep


class MlpSession(ProposerSession):
    def __init__(self, proposer: "MlpSpeculatorProposer"):
        self._p = proposer
        self._store = HistoryStore(proposer.idle_timeout_s)

    def __contains__(self, seq_id: str) -> bool:
        return seq_id in self._store

    def propose(self, steps: list[SequenceStep]) -> list[Draft]:
        self._store.evict_idle()
        drafts: dict[str, Draft] = {}
        work: list[tuple[SequenceStep, int, torch.Tensor]] = []
        for step in steps:
            history = self._store.apply(step)
            if not history:
                drafts[step.seq_id] = Draft(step.seq_id, resync=True)
                continue
            k = min(step.k, self._p.max_k)
            hidden = step.hidden_state
            if k <= 0 or hidden is None or tuple(hidden.shape) != (self._p.hidden_size,):
                drafts[step.seq_id] = Draft(step.seq_id)  # nothing to draft from
                continue
            work.append((step, history[-1], hidden))
        chains = [w for w in work if w[0].max_branch <= 1]
        trees = [w for w in work if w[0].max_branch > 1]
        for d in (draft_in_batches(chains, self._p.max_batch, self._p.draft_batch)
                  + draft_in_batches(trees, self._p.max_batch, self._p.draft_tree_batch)):
            drafts[d.seq_id] = d
        return [drafts[s.seq_id] for s in steps]

    def release(self, seq_ids: list[str]) -> None:
        self._store.release(seq_ids)

    def close(self) -> None:
        self._store.clear()


def _resolve_tokenizer_dir(spec_dir: Path, recorded: str) -> Path | None:
    """The target directory the speculator's config records, as given or next to the speculator."""
    if not recorded:
        return None
    for cand in (Path(recorded), spec_dir / recorded, spec_dir.parent / Path(recorded).name):
        if (cand / "config.json").is_file():
            return cand
    return None


def _family_fingerprint(tokenizer) -> str:
    """sha256 over the sorted (token, id) pairs, as recorded in the speculator's config."""
    items = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256(json.dumps(items, ensure_ascii=False).encode()).hexdigest()


class MlpSpeculatorProposer(Proposer):
    def __init__(self, model: MLPSpeculator, device: torch.device, tokenizer_fingerprint: str,
                 model_name: str = "", max_k: int = 16, draft_top_k: int = 32,
                 max_batch: int = 32, idle_timeout_s: float = 600.0, linear: str = "auto",
                 vocab_subset: torch.Tensor | None = None):
        """vocab_subset: token ids its heads score (kernels/vocab_subset.py), None for all."""
        # its projections and heads run on packed weights (kernels/linear.py)
        self.linear = pack_linears(model, linear, invariant=False)  # drafts: fewest bytes
        if vocab_subset is not None:
            model.restrict_vocab(vocab_subset, self.linear)
        self.model = model
        self.device = device
        self.vocab_size = model.config.vocab_size
        self.fetch = HostFetch(device)  # a step's one copy back
        self.warm_hidden_size = model.config.emb_dim
        self.hidden_size = model.config.emb_dim
        self.fingerprint = tokenizer_fingerprint
        self.model_name = model_name
        self.max_k = min(max_k, model.config.n_predict)
        self.draft_top_k = draft_top_k
        self.max_batch = max(1, max_batch)
        self.idle_timeout_s = idle_timeout_s
        # the heads (greedy, and sampled: choose_static) replayed as device graphs per batch
        # bucket where the device has them
        self.replay = Replay(device)
        self.fallbacks = EagerFallbacks("the MLP speculator's heads")
        self.buckets = [b for b in (1, 2, 4, 8, 16, 32, 64) if b < self.max_batch] + [
            self.max_batch]

    @classmethod
    def from_config(cls, config) -> "MlpSpeculatorProposer":
        return load_learned(cls, config)

    @classmethod
    def load(cls, path: str, device: torch.device, dtype: torch.dtype, tokenizer: str = "",
             trust_remote_code: bool = False, vocab_subset: str = "auto",
             **kwargs) -> "MlpSpeculatorProposer":
        from splitspec.modelio import load_tokenizer, model_name, tokenizer_fingerprint
        from splitspec.vocab_frequencies import resolve_subset

        spec_dir = Path(path)
        config = MLPSpeculatorConfig.from_file(spec_dir / CONFIG_NAME)  # malformed: names the field
        tok_dir = Path(tokenizer) if tokenizer else _resolve_tokenizer_dir(
            spec_dir, config.target_model)
        if tok_dir is None:
            raise ValueError(f"{path}: cannot find the target's tokenizer "
                             f"(config target_model={config.target_model!r}); pass --tokenizer")
        tok = load_tokenizer(tok_dir, trust_remote_code)
        recorded = config.target_vocab_fingerprint
        if recorded and recorded != _family_fingerprint(tok):
            raise ValueError(f"{path} was trained for a different vocabulary than the tokenizer "
                             f"in {tok_dir}")
        model = MLPSpeculator.from_pretrained(spec_dir, dtype=dtype, device=device)
        subset = resolve_subset(spec_dir, vocab_subset, config.vocab_size)
        return cls(model, device, tokenizer_fingerprint(tok), model_name(path),
                   vocab_subset=subset, **kwargs)

    def warm_up(self) -> None:
        super().warm_up()
        if not self.replay.enabled:
            return
        dtype = self.model.head[0].weight.dtype
        for b in self.buckets:
            self.replay.capture(b, self._greedy_heads, {
                "hidden": torch.zeros(b, self.hidden_size, dtype=dtype, device=self.device),
                "token": torch.zeros(b, dtype=torch.long, device=self.device)})
            inputs = {name: torch.zeros_like(v, device=self.device)
                      for name, v in self._sampled_values([], b, dtype).items()}
            inputs["top_p"].fill_(1.0)
            inputs["noise"].fill_(1.0)
            self.replay.capture(("sampled", b), self._sampled_heads, inputs)

    def _greedy_heads(self, x: dict[str, torch.Tensor]) -> torch.Tensor:
        """Every head greedily, token fed back on the device: [B, max_k] tokens."""
        state, tok, out = self.model.input_state(x["hidden"]), x["token"], []
        for i in range(self.max_k):
            state, logits = self.model.step(state, tok, i)
            tok = logits.argmax(dim=-1)
            out.append(tok)
        return torch.stack(out, 1)

    @property
    def _top_k(self) -> int:
        return min(self.draft_top_k, self.vocab_size)

    def _sampled_heads(self, x: dict[str, torch.Tensor]
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every head choosing each row's token by its sampling inputs as the eager chooser
        does (greedy rows: argmax), fed back on the device: tokens [B, max_k] and each head's
        truncated q, token ids and probabilities [max_k, B, K]."""
        state, tok = self.model.input_state(x["hidden"]), x["token"]
        tokens, q_ids, q_probs = [], [], []
        for i in range(self.max_k):
            state, logits = self.model.step(state, tok, i)
            tok, ids, probs = choose_static(logits, x, x["halves"][i], x["noise"][i],
                                            self._top_k)
            tokens.append(tok)
            q_ids.append(ids)
            q_probs.append(probs)
        return torch.stack(tokens, 1), torch.stack(q_ids), torch.stack(q_probs)

    def _sampled_values(self, work, bucket: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """The sampled heads' inputs for a batch padded to `bucket` rows (padding rows greedy),
        on the host but for the unseeded rows' noise, drawn on the device."""
        n, heads = len(work), self.max_k
        params = [step.sampling for step, _, _ in work]
        x = {"hidden": torch.zeros(bucket, self.hidden_size, dtype=dtype),
             "token": torch.zeros(bucket, dtype=torch.long),
             "temperature": torch.zeros(bucket), "top_k": torch.zeros(bucket, dtype=torch.long),
             "top_p": torch.ones(bucket), "min_p": torch.zeros(bucket),
             "keyed": torch.zeros(bucket, dtype=torch.long),
             "halves": torch.zeros(heads, bucket, 2, dtype=torch.long),
             "noise": draw_exponentials(heads * bucket, self._top_k, self.device).view(
                 heads, bucket, self._top_k)}
        if n:
            x["hidden"][:n] = torch.stack([h for _, _, h in work]).to(dtype)
            x["token"][:n] = torch.tensor([t for _, t, _ in work])
        for r, p in enumerate(params):
            if not p.greedy:
                x["temperature"][r], x["top_k"][r] = p.temperature, p.top_k
                x["top_p"][r], x["min_p"][r] = p.top_p, p.min_p
        for i in range(heads):
            keys = draft_keys(params, [step.history_len + i for step, _, _ in work])
            for r, key in enumerate(keys):
                if key is not None:
                    x["keyed"][r] = 1
                    x["halves"][i, r] = key_halves([key])[0]
        return x

    def describe(self) -> ProposerDescription:
        return ProposerDescription(method="mlp", vocab_size=self.vocab_size,
                                   tokenizer_fingerprint=self.fingerprint,
                                   max_num_speculative_tokens=self.max_k,
                                   needs_hidden_state=True, model=self.model_name)

    def open_session(self) -> MlpSession:
        return MlpSession(self)

    @torch.inference_mode()
    def draft_batch(self, work: list[tuple[SequenceStep, int, torch.Tensor]]) -> list[Draft]:
        """Run the heads over the whole batch; row i keeps its first k_i tokens. Each head's
        token is chosen on the device and fed to the next head there (a DraftChooser prepares
        every head's host decisions and noise up front); the drafts come back in one copy."""
        ks = [min(step.k, self.max_k) for step, _, _ in work]
        params = [step.sampling for step, _, _ in work]
        dtype = self.model.head[0].weight.dtype
        bucket = next((b for b in self.buckets if b >= len(work)), None)
        offsets = logit_offsets(params, self.vocab_size, self.device)
        # the captured heads have no input for a logit bias or allowed ids: such rows run eagerly
        if offsets is None and bucket in self.replay and all(p.greedy for p in params):
            return self._replayed(work, ks, bucket, dtype)
        if offsets is None and ("sampled", bucket) in self.replay:
            return self._replayed_sampled(work, ks, bucket, dtype)
        if self.replay.enabled:
            self.fallbacks.record("batch" if bucket is None else "not_captured", rows=len(work))
        hidden = _to(torch.stack([h for _, _, h in work]), self.device).to(dtype)  # [B, H]
        tok = _to(torch.tensor([t for _, t, _ in work], dtype=torch.long), self.device)  # [B]
        state = self.model.input_state(hidden)  # [B, H]
        heads = max(ks)
        keys = [draft_keys(params, [step.history_len + i for step, _, _ in work])
                for i in range(heads)]
        chooser = DraftChooser(params, keys, self.draft_top_k, self.vocab_size, self.device)
        tokens, q_ids, q_probs = [], [], []
        for i in range(heads):
            # one path per row: head i's chosen token feeds head i + 1
            state, logits = self.model.step(state, tok, i)  # [B, inner], [B, V]
            logits = logits.float() if offsets is None else logits.float() + offsets
            tok, q = chooser(logits, i)
            tokens.append(tok)
            if q is not None:
                q_ids.append(q[0])
                q_probs.append(q[1])
        ints = [torch.stack(tokens, 1)] + ([torch.stack(q_ids)] if q_ids else [])
        (tok_h, *qi_h), qp_h = self.fetch(ints, [torch.stack(q_probs)] if q_probs else [])
        tok_h = tok_h.tolist()
        dists = ([chooser.rows_q(a, b) for a, b in zip(qi_h[0].tolist(), qp_h[0].tolist())]
                 if qi_h else None)
        drafts = []
        for r, ((step, _, _), k) in enumerate(zip(work, ks)):
            rows_q = None if dists is None or dists[0][r] is None else [
                dists[i][r] for i in range(k)]
            drafts.append(Draft(step.seq_id, tok_h[r][:k],
                                q=SparseProbs.from_rows(rows_q) if rows_q else None))
        return drafts

    def _replayed(self, work, ks: list[int], bucket: int, dtype: torch.dtype) -> list[Draft]:
        """draft_batch's greedy steps through the captured heads: rows padded to the bucket."""
        n = len(work)
        hidden = torch.zeros(bucket, self.hidden_size, dtype=dtype)
        hidden[:n] = torch.stack([h for _, _, h in work]).to(dtype)
        token = torch.zeros(bucket, dtype=torch.long)
        token[:n] = torch.tensor([t for _, t, _ in work])
        out = self.replay(bucket, self._greedy_heads, {"hidden": _to(hidden, self.device),
                                                       "token": _to(token, self.device)})
        (tokens,), _ = self.fetch([out[:n]])
        return [Draft(step.seq_id, tokens[r, :k].tolist())
                for r, ((step, _, _), k) in enumerate(zip(work, ks))]

    @torch.inference_mode()
    def _replayed_sampled(self, work, ks: list[int], bucket: int, dtype: torch.dtype
                          ) -> list[Draft]:
        """draft_batch's steps with sampled rows through the captured sampled heads (run
        eagerly where none is captured): rows padded to the bucket, one copy out."""
        n = len(work)
        values = {name: _to(v, self.device)
                  for name, v in self._sampled_values(work, bucket, dtype).items()}
        tokens, q_ids, q_probs = self.replay(("sampled", bucket), self._sampled_heads, values)
        (tok_h, qi_h), (qp_h,) = self.fetch([tokens[:n], q_ids[:, :n]], [q_probs[:, :n]])
        tok_h, qi_h, qp_h = tok_h.tolist(), qi_h.tolist(), qp_h.tolist()
        drafts = []
        for r, ((step, _, _), k) in enumerate(zip(work, ks)):
            q = None
            if not step.sampling.greedy:
                q = SparseProbs.from_rows([sparse_row(qi_h[i][r], qp_h[i][r])
                                           for i in range(k)])
            drafts.append(Draft(step.seq_id, tok_h[r][:k], q=q))
        return drafts

    @torch.inference_mode()
    def draft_tree_batch(self, work: list[tuple[SequenceStep, int, torch.Tensor]]) -> list[Draft]:
        """A tree per row (steps with max_branch > 1): top-max_branch tokens per head, at most k
        nodes kept best-first by cumulative log-probability; deterministic nodes for greedy and
        sampled requests alike. Eager (its top-k per head varies by row): counted as such on a
        device that captures."""
        if self.replay.enabled:
            self.fallbacks.record("tree", rows=len(work))
        dtype = self.model.head[0].weight.dtype
        hidden = _to(torch.stack([h for _, _, h in work]), self.device).to(dtype)  # [B, H]
        tok = _to(torch.tensor([t for _, t, _ in work], dtype=torch.long), self.device)  # [B]
        trees = self.model.generate_tree(hidden, tok, [min(s.k, self.max_k) for s, _, _ in work],
                                         [s.max_branch for s, _, _ in work], self.max_k)
        return [Draft(step.seq_id, tokens, parents=parents)
                for (step, _, _), (tokens, parents) in zip(work, trees)]
