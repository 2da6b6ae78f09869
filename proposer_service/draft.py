"""Draft-model proposer: a small causal LM with its own KV cache per sequence.

Per sequence the session keeps the token history (rebuilt from the verifier's deltas) and the
draft model's KV for a prefix of it. One step:

    1. apply the delta (accepted drafts + the recovered or bonus token);
    2. roll the KV back to the longest prefix that is still valid: last step the draft cached
       its own draft tokens d1..d_{k-1}, and the verifier kept only some of them;
    3. feed the history tokens not cached yet: the new last token, and when every draft was
       accepted also d_k, which the draft sampled but never fed (the bonus-token case);
       d1 comes from the logits at the last of them;
    4. draft the rest autoregressively: iteration j feeds d_j and picks d_{j+1}.

Steps 3 and 4 run as one batch over all sequences of the step: the per-sequence caches are
left-padded into one batch cache (zeros, masked out by the attention mask), the first iteration
feeds each row's not-yet-cached tokens (right-padded to the longest; 1 token normally, 2 in the
bonus case) and reads the logits at the row's last real position, and each row has its own
positions. Only a long catch-up (a (re)sync: the whole prompt) is prefilled per sequence first,
so that one long prompt does not pad every row. Trade-off: building the padded cache copies
O(batch x longest history) of KV per step, small next to k forward passes for the small drafts
this serves; a paged cache would avoid the copy.

Draft tokens are chosen by proposer_service/drafting.py (argmax for greedy requests; for sampled
ones a token drawn from the top-K-truncated q, K = --draft-top-k, sent with exactly that q).
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass, field

import torch

from kernels.sparse_probs import SparseProbs
from proposer_service.base import (
    HistoryStore,
    Proposer,
    ProposerSession,
    draft_in_batches,
    load_learned,
)
from proposer_service.drafting import Row, choose_tokens, draft_keys
from splitspec.lean_llama import LeanDecoder
from splitspec.params import SamplingParams
from splitspec.proposal import (
    PRECOMPUTE_HIT,
    PRECOMPUTE_MISS,
    AheadDraft,
    Draft,
    ProposerDescription,
    SequenceStep,
)

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [1, H_kv, L, D]


@dataclass
class _Buffers:
    """Preallocated per-layer caches of one draft call (lean forward), the first `length`
    columns filled; owned by the call, so written in place."""

    kv: KV
    length: int

    def view(self) -> KV:
        return [(k[:, :, :self.length], v[:, :, :self.length]) for k, v in self.kv]


# -- the session -------------------------------------------------------------------------------

@dataclass
class _SeqState:
    kv: KV | None = None  # None: nothing cached
    cached: list[int] = field(default_factory=list)  # tokens whose KV is in kv, in order
    # per token of the last draft: the draft model's most likely tokens there (its guesses of
    # the recovered token, should the verifier reject that draft token)
    # per token of the last draft: the draft model's two most likely tokens there and their
    # probabilities (its guesses of the recovered token, should the verifier reject that token)
    alternatives: list[tuple[list[int], list[float]]] = field(default_factory=list)

    def copy(self) -> "_SeqState":
        """Another state over the same KV tensors (updates replace tensors, never write them)."""
        return _SeqState(None if self.kv is None else list(self.kv), list(self.cached))

    def length(self) -> int:
        return len(self.cached)

    def truncate(self, n: int) -> None:
        """Keep the first n cached positions (rollback of rejected drafts)."""
        if n >= len(self.cached):
            return
        self.cached = self.cached[:n]
        if self.kv is not None:
            self.kv = [(k[:, :, :n], v[:, :, :n]) for k, v in self.kv] if n else None


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@dataclass
class _AheadPlan:
    """A sequence to draft ahead for: its step, the history its last draft continued, that draft
    and the draft's state after it (a copy sharing the KV tensors)."""

    step: SequenceStep
    history: list[int]
    draft: Draft
    state: _SeqState

    def rejection_outcomes(self) -> list[tuple[int, ...]]:
        """The deltas of the likely rejections, likeliest first: the first n drafts accepted,
        then the draft's own best other token at position n + 1 as the recovered token. Scored
        by the draft's own probabilities: P(d_1..d_n accepted) * P(the guess), each taken as
        the draft model's probability of that token."""
        scored, reach = [], 1.0
        for n, (token, (ids, probs)) in enumerate(zip(self.draft.tokens,
                                                      self.state.alternatives)):
            guess = next(((a, p) for a, p in zip(ids, probs) if a != token), None)
            if guess is not None:
                scored.append((reach * guess[1], n, tuple(self.draft.tokens[:n]) + (guess[0],)))
            reach *= probs[ids.index(token)] if token in ids else 0.1
        return [delta for _, _, delta in sorted(scored, key=lambda x: (-x[0], x[1]))]


@dataclass
class _Ready:
    """Drafted ahead for one sequence: per outcome (the delta the verifier will send), the draft
    for the step after it and the draft state that goes with it."""

    k: int
    sampling: SamplingParams
    drafts: dict[tuple[int, ...], tuple[Draft, _SeqState]]
    history_len: int = 0  # before the outcome: the history the step's draft continued


class DraftSession(ProposerSession):
    def __init__(self, proposer: "DraftModelProposer"):
        self._p = proposer
        self._store = HistoryStore(proposer.idle_timeout_s)
        self._states: dict[str, _SeqState] = {}
        self._plans: dict[str, _AheadPlan] = {}  # asked to draft ahead, not yet drafted
        self._ready: dict[str, _Ready] = {}  # drafted ahead, waiting for the outcome

    def cached_tokens(self, seq_id: str) -> list[int]:
        """The tokens whose KV the draft holds for a sequence (its history, then own drafts)."""
        state = self._states.get(seq_id)
        return [] if state is None else list(state.cached)

    def cached_kv_length(self, seq_id: str) -> int:
        state = self._states.get(seq_id)
        return 0 if state is None or state.kv is None else state.kv[0][0].shape[2]

    def propose(self, steps: list[SequenceStep]) -> list[Draft]:
        for sid in self._store.evict_idle():
            self._states.pop(sid, None)
            self._ready.pop(sid, None)
        self._plans.clear()
        drafts: dict[str, Draft] = {}
        work: list[tuple[SequenceStep, list[int], _SeqState]] = []
        missed: set[str] = set()  # drafted ahead for other outcomes: drafted afresh
        for step in steps:
            ready = self._ready.pop(step.seq_id, None)
            history = self._store.apply(step)
            if history is None or not history:
                self._states.pop(step.seq_id, None)
                drafts[step.seq_id] = Draft(step.seq_id, resync=True)
                continue
            state = self._states.setdefault(step.seq_id, _SeqState())
            k = min(step.k, self._p.max_k)
            if k <= 0 or len(history) + k > self._p.max_positions:
                # k = 0: just recorded (caught up lazily); past the draft's context: no drafts
                drafts[step.seq_id] = Draft(step.seq_id)
                continue
            step = dataclasses.replace(step, k=k) if k != step.k else step
            hit = self._take_ready(step, ready)
            if hit is not None:
                drafts[step.seq_id] = hit
                self._plan_ahead(step, history, hit)
                continue
            if ready is not None:
                missed.add(step.seq_id)
            work.append((step, list(history), state))
        for (step, history, _), d in zip(
                work, draft_in_batches(work, self._p.max_batch, self._p.draft_batch)):
            d.precompute = PRECOMPUTE_MISS if step.seq_id in missed else ""
            drafts[d.seq_id] = d
            self._plan_ahead(step, history, d)
        return [drafts[s.seq_id] for s in steps]

    # -- overlapped speculation ---------------------------------------------------------------

    def _take_ready(self, step: SequenceStep, ready: _Ready | None) -> Draft | None:
        """The draft drafted ahead for this step's outcome, its state made the sequence's; None
        on a miss (then the sequence is drafted afresh, never from a draft ahead of another
        outcome)."""
        k = step.k
        found = (None if ready is None or step.full_history or k > ready.k
                 or step.sampling != ready.sampling
                 else ready.drafts.get(tuple(step.new_tokens)))
        if found is None:
            return None
        draft, state = found
        self._states[step.seq_id] = state
        q = None if draft.q is None else SparseProbs.from_rows(draft.q.rows()[:k])
        return Draft(step.seq_id, draft.tokens[:k], q, precompute=PRECOMPUTE_HIT)

    def _plan_ahead(self, step: SequenceStep, history: list[int], draft: Draft) -> None:
        k = len(draft.tokens)
        if (step.precompute and self._p.precompute and k and not draft.resync
                and len(history) + 2 * k + 1 <= self._p.max_positions):
            state = self._states[step.seq_id]
            plan = _AheadPlan(step, list(history), draft, state.copy())
            plan.state.alternatives = state.alternatives
            self._plans[step.seq_id] = plan

    def has_ahead_work(self) -> bool:
        return bool(self._plans)

    def ahead_may_hit(self, steps: list[SequenceStep]) -> bool:
        for step in steps:
            plan = self._plans.get(step.seq_id)
            if plan is None or step.full_history:
                continue
            delta, d = tuple(step.new_tokens), plan.draft.tokens
            if (len(delta) == len(d) + 1 and list(delta[:-1]) == d) \
                    or delta in plan.rejection_outcomes()[:self._p.ahead_rejections]:
                return True
        return False

    def draft_ahead(self, cancel: threading.Event) -> None:
        """One batch over every planned sequence's likely outcomes, k drafts each:
        - all k accepted (PEARL's post-verify): keep drafting from d_k, k + 1 tokens; the first
          is the guess of the bonus token, the other k the draft for the step after it;
        - rejected at position n + 1 (SSD): history + d_1..d_n + the draft's best other token
          there (the recovered token's guess), k drafts.
        Rows are drafted as fresh ones would be (same positions, so the same keyed noise)."""
        plans = dict(self._plans)  # kept for ahead_may_hit until the next propose
        work, outcomes = [], []
        for sid, plan in plans.items():
            k, h, d = len(plan.draft.tokens), plan.history, plan.draft.tokens
            work.append((dataclasses.replace(plan.step, k=k + 1), h + d, plan.state.copy()))
            outcomes.append((sid, None))
            for delta in plan.rejection_outcomes()[:self._p.ahead_rejections]:
                work.append((dataclasses.replace(plan.step, k=k), h + list(delta),
                             plan.state.copy()))
                outcomes.append((sid, delta))
        # Entries first: a cancelled drafting ahead leaves them empty, so the step counts a miss.
        ready = {sid: _Ready(len(p.draft.tokens), p.step.sampling, {}, len(p.history))
                 for sid, p in plans.items()}
        self._ready.update(ready)
        if len(plans) == 1 and self._p.lean is not None:  # batch 1: rows share one cache
            plan = next(iter(plans.values()))
            n_hist, d = len(plan.history), plan.draft.tokens
            rows = [(n_hist + len(d) - 1, d[-1], len(d) + 1)] + [
                (n_hist + len(delta) - 1, delta[-1], len(d)) for _, delta in outcomes[1:]]
            shared = self._p.draft_shared(plan.step, rows, plan.state, cancel, guess_row=0)
            if shared is None:  # cancelled: keep nothing
                return
            results = [draft for draft, _ in shared]
            work = [(None, None, state) for _, state in shared]
        else:
            results = draft_in_batches(work, self._p.max_batch,
                                       lambda w: self._p.draft_batch(w, cancel) or [])
            if len(results) != len(work):  # cancelled: keep nothing
                return
        for (sid, delta), (_, _, state), draft in zip(outcomes, work, results):
            entry = ready[sid]
            if delta is None:  # all accepted: the first token is the bonus token's guess
                bonus, q = draft.tokens[0], draft.q
                delta = tuple(plans[sid].draft.tokens) + (bonus,)
                draft = Draft(sid, draft.tokens[1:],
                              None if q is None else SparseProbs.from_rows(q.rows()[1:]))
                state.alternatives = state.alternatives[1:]
            entry.drafts[delta] = (draft, state)

    def ahead_drafts(self) -> list[AheadDraft]:
        # exactly what _take_ready answers for each outcome (cut to the step's k by both sides)
        return [AheadDraft(r.history_len + len(delta), delta, Draft(sid, d.tokens, d.q))
                for sid, r in self._ready.items() for delta, (d, _) in r.drafts.items()]

    def release(self, seq_ids: list[str]) -> None:
        self._store.release(seq_ids)
        for sid in seq_ids:
            self._states.pop(sid, None)
            self._ready.pop(sid, None)
            self._plans.pop(sid, None)

    def close(self) -> None:
        self._store.clear()
        self._states.clear()
        self._ready.clear()
        self._plans.clear()


# -- the proposer ------------------------------------------------------------------------------

class DraftModelProposer(Proposer):
    def __init__(self, model, device: torch.device, vocab_size: int, tokenizer_fingerprint: str,
                 model_name: str = "", max_k: int = 16, draft_top_k: int = 32,
                 max_batch: int = 32, idle_timeout_s: float = 600.0, precompute: bool = True,
                 ahead_rejections: int = 3, linear: str = "auto"):
        if draft_top_k < 1:
            raise ValueError("draft_top_k must be >= 1")
        self.model = model
        self.device = device
        self.vocab_size = vocab_size
        self.fingerprint = tokenizer_fingerprint
        self.model_name = model_name
        self.max_k = max_k
        self.draft_top_k = draft_top_k
        self.max_batch = max(1, max_batch)
        self.idle_timeout_s = idle_timeout_s
        # Positions the draft can encode; longer sequences get no drafts (the target may have a
        # longer context than its draft).
        self.max_positions = getattr(model.config, "max_position_embeddings", None) or 2**31
        # Catch-ups up to this many tokens (the usual 1-2 after a verification step) run inside
        # the batched first iteration; longer ones ((re)syncs: whole prompts) are prefilled per
        # sequence, so one long prompt does not pad every row of the batch to its length.
        self.max_batched_catch_up = 8
        # The draft's forward: plain tensor ops where the architecture allows
        # (splitspec/lean_llama.py), else the transformers forward.
        self.lean = LeanDecoder(model, linear) if LeanDecoder.supports(model) else None
        # Overlap: draft ahead for all-accepted plus this many rejection outcomes (the likeliest
        # by the draft's own probabilities) per sequence, in one batch while the verifier
        # verifies. Each row costs every forward of the batch a little: a few cover most of the
        # probability.
        self.precompute = precompute
        self.ahead_rejections = ahead_rejections

    @classmethod
    def from_config(cls, config) -> "DraftModelProposer":
        return load_learned(cls, config)

    @classmethod
    def load(cls, path: str, device: torch.device, dtype: torch.dtype, tokenizer: str = "",
             trust_remote_code: bool = False, **kwargs) -> "DraftModelProposer":
        from splitspec.modelio import (
            load_causal_lm,
            load_tokenizer,
            model_name,
            tokenizer_fingerprint,
        )

        model = load_causal_lm(path, device, dtype, trust_remote_code)
        tok = load_tokenizer(tokenizer or path, trust_remote_code)
        vocab = model.get_output_embeddings().weight.shape[0]
        return cls(model, device, vocab, tokenizer_fingerprint(tok), model_name(path), **kwargs)

    def describe(self) -> ProposerDescription:
        return ProposerDescription(method="draft", vocab_size=self.vocab_size,
                                   tokenizer_fingerprint=self.fingerprint,
                                   max_num_speculative_tokens=self.max_k, model=self.model_name,
                                   precompute=self.precompute)

    def open_session(self) -> DraftSession:
        return DraftSession(self)

    # -- model calls --------------------------------------------------------------------------

    def _cache(self, kv: KV | None):
        from transformers import DynamicCache

        if kv is None:
            return DynamicCache(config=self.model.config)
        return DynamicCache(ddp_cache_data=kv)

    @staticmethod
    def _kv_of(cache) -> KV:
        return [(layer.keys, layer.values) for layer in cache.layers]

    def _forward(self, ids: torch.Tensor, pos: torch.Tensor, kv: KV | None,
                 key_mask: torch.Tensor | None, keep: int) -> tuple[torch.Tensor, KV]:
        """ids, pos [B, S] after the cache kv ([B, H_kv, L, D] per layer; key_mask [B, L + S]
        bool: real columns, None: all) -> logits of the last `keep` rows [B, keep, V], the
        extended cache (new tensors: kv is never written)."""
        if isinstance(kv, _Buffers):
            logits, _ = self.lean.forward(ids, pos, kv.kv, key_mask, keep, length=kv.length)
            kv.length += ids.shape[1]
            return logits, kv
        if self.lean is not None:
            return self.lean.forward(ids, pos, kv, key_mask, keep)
        cache = self._cache(kv)
        res = self.model(input_ids=ids, position_ids=pos, past_key_values=cache,
                         attention_mask=None if key_mask is None else key_mask.long(),
                         use_cache=True, logits_to_keep=keep)
        return res.logits, self._kv_of(cache)

    @torch.inference_mode()
    def _feed(self, state: _SeqState, tokens: list[int]) -> None:
        """Append tokens to one sequence's cache (catch-up and (re)sync prefill)."""
        if not tokens:
            return
        start = state.length()
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)  # [1, S]
        pos = torch.arange(start, start + len(tokens), device=self.device)[None]  # [1, S]
        _, state.kv = self._forward(ids, pos, state.kv, None, 1)
        state.cached.extend(tokens)

    @torch.inference_mode()
    def draft_batch(self, work: list[tuple[SequenceStep, list[int], _SeqState]],
                    cancel: threading.Event | None = None) -> list[Draft] | None:
        """Catch every sequence up to its history and draft its k tokens, all rows together.

        Row i of the batch (columns = positions in the batch cache):
            [left pad][cached_i][pending_i][right pad][d1 .. d_{kmax-1}]
             <---- lmax ------> <------- s0 ------->
        pending_i are the history tokens not cached yet (the last one always among them); all
        of them go in iteration 0, whose logits are read at each row's last real position. Pads
        are zero KV or masked-out queries: every query still sees at least its own token.
        Each row drafts step.k tokens. Returns None (states' KV untouched) once cancel is set.
        """
        for _, history, state in work:
            # Longest cached prefix still valid; the last history token is never cached here.
            state.truncate(min(_common_prefix(state.cached, history), len(history) - 1))
            if len(history) - state.length() > self.max_batched_catch_up:
                self._feed(state, history[state.length():-1])  # a (re)sync: prefill alone
        ks = [step.k for step, _, _ in work]
        params = [step.sampling for step, _, _ in work]
        lens = [state.length() for _, _, state in work]
        pending = [h[n:] for (_, h, _), n in zip(work, lens)]
        b, lmax, kmax = len(work), max(lens), max(ks)
        s0 = max(len(p) for p in pending)
        # One row (batch-1 decoding): its own cache as is, no padding, no mask, nothing to cut
        # out afterwards. (Cache updates concatenate: the state's tensors are never written.)
        single = b == 1
        kv = (work[0][2].kv if single
              else self._padded_cache([state.kv for _, _, state in work], lens, lmax))
        if single and kv is not None and self.lean is not None:
            # lean and one row: the cache copied once into room for this step's columns
            kv = _Buffers(self.lean.buffers(kv, 1, lmax + s0 + kmax - 1), lmax)
        mask = torch.zeros(b, lmax + s0 + kmax - 1, dtype=torch.bool)  # [B, columns]
        ids = torch.zeros(b, s0, dtype=torch.long)  # [B, s0], right-padded
        for i, (n, p) in enumerate(zip(lens, pending)):
            mask[i, lmax - n:lmax + len(p)] = True
            mask[i, lmax + s0:] = True
            ids[i, :len(p)] = torch.tensor(p)
        mask = mask.to(self.device)
        pos = (torch.tensor(lens)[:, None] + torch.arange(s0)).to(self.device)  # [B, s0]
        last = torch.tensor([len(p) - 1 for p in pending], device=self.device)  # [B]
        next_pos = torch.tensor([n + len(p) for n, p in zip(lens, pending)],
                                device=self.device)  # [B], position of d1
        out_tokens: list[list[int]] = [[] for _ in work]
        out_dists: list[list[Row | None]] = [[] for _ in work]
        out_alts: list[list[tuple[list[int], list[float]]]] = [[] for _ in work]
        first_pos = [len(h) for _, h, _ in work]  # position of d1
        inputs, width = ids.to(self.device), lmax + s0
        for j in range(kmax):
            if cancel is not None and cancel.is_set():
                return None
            out, kv = self._forward(inputs, pos, kv, None if single else mask[:, :width],
                                    inputs.shape[1])
            if j == 0:
                logits = out[torch.arange(b, device=self.device), last]  # [B, V]
            else:
                logits = out[:, -1]
            keys = draft_keys(params, [p + j for p in first_pos])
            picked, dists = choose_tokens(logits.float(), params, keys, self.draft_top_k)
            top = logits.softmax(dim=-1).topk(2, dim=-1)  # [B, 2]: guesses of a recovery
            alts = list(zip(top.indices.tolist(), top.values.tolist()))
            for i, (t, d) in enumerate(zip(picked, dists)):
                out_tokens[i].append(t)
                out_dists[i].append(d)
                out_alts[i].append(alts[i])
            inputs = torch.tensor(picked, dtype=torch.long, device=self.device)[:, None]
            pos = (next_pos + j)[:, None]  # [B, 1]
            width += 1
        # Keep per row: its cached prefix, its pending tokens, d1..d_{k_i - 1} (d_{k_i} is
        # drafted, not fed); drop the pads and the drafts beyond its own k.
        drafts = []
        for i, ((step, history, state), k, n, p) in enumerate(zip(work, ks, lens, pending)):
            if single:  # [cached][pending][d1 .. d_{k-1}]: all of it is kept
                state.kv = kv.view() if isinstance(kv, _Buffers) else kv
            else:
                spans = [(lmax - n, lmax + len(p)), (lmax + s0, lmax + s0 + k - 1)]
                state.kv = [(torch.cat([kk[i:i + 1, :, a:z] for a, z in spans], dim=2),
                             torch.cat([vv[i:i + 1, :, a:z] for a, z in spans], dim=2))
                            for kk, vv in kv]
            state.cached = history + out_tokens[i][:k - 1]
            state.alternatives = out_alts[i][:k]
            sampled = out_dists[i][0] is not None
            drafts.append(Draft(step.seq_id, out_tokens[i][:k],
                                q=SparseProbs.from_rows(out_dists[i][:k]) if sampled else None))
        return drafts

    @torch.inference_mode()
    def draft_shared(self, step: SequenceStep, rows: list[tuple[int, int, int]],
                     state: _SeqState, cancel: threading.Event, guess_row: int | None = None
                     ) -> list[tuple[Draft, _SeqState]] | None:
        """Draft several continuations of prefixes of one sequence's cache in one batch, with
        no copy of the cache per row: row (valid, token, k) continues the first `valid` cached
        tokens with `token` (at position valid) and drafts k tokens. Every row reads the shared
        columns through its key mask, so they differ only in their own new columns. Returns
        per row its draft and the state a fresh draft would have left (None once cancel is set).
        The first token of row `guess_row` is a guess, not a draft (the bonus token of the
        all-accepted outcome). Needs the lean forward."""
        c, b = state.length(), len(rows)
        kmax = max(k for _, _, k in rows)
        kv = self.lean.buffers(state.kv, b, c + kmax)  # the shared columns copied once
        key_mask = torch.zeros(b, c + kmax, dtype=torch.bool)  # [B, columns]
        for i, (valid, _, _) in enumerate(rows):
            key_mask[i, :valid] = True
        key_mask[:, c:] = True
        ids = torch.tensor([[t] for _, t, _ in rows], device=self.device)  # [B, 1]
        pos = torch.tensor([[valid] for valid, _, _ in rows], device=self.device)  # [B, 1]
        params = [step.sampling] * b
        out_tokens: list[list[int]] = [[] for _ in rows]
        out_dists: list[list[Row | None]] = [[] for _ in rows]
        out_alts: list[list[tuple[list[int], list[float]]]] = [[] for _ in rows]
        for j in range(kmax):
            if cancel.is_set():
                return None
            logits, _ = self.lean.forward(ids, pos, kv, key_mask[:, :c + j + 1].to(self.device),
                                          1, length=c + j)
            logits = logits[:, -1].float()  # [B, V]
            keys = draft_keys(params, (pos[:, 0] + 1).tolist())
            picked, dists = choose_tokens(logits, params, keys, self.draft_top_k)
            if j == 0 and guess_row is not None and keys[guess_row] is None:
                # the row's first token is a guess of what the verifier emits (not a draft):
                # the mode is the likelier guess than a sample (seeded rows keep the keyed
                # choice, which is the verifier's own rule applied to q)
                picked[guess_row] = int(logits[guess_row].argmax())
            top = logits.softmax(dim=-1).topk(2, dim=-1)
            alts = list(zip(top.indices.tolist(), top.values.tolist()))
            for i, (t, d) in enumerate(zip(picked, dists)):
                out_tokens[i].append(t)
                out_dists[i].append(d)
                out_alts[i].append(alts[i])
            ids = torch.tensor(picked, dtype=torch.long, device=self.device)[:, None]
            pos = pos + 1
        out = []
        for i, (valid, token, k) in enumerate(rows):
            row_kv = [(torch.cat([kk[i:i + 1, :, :valid], kk[i:i + 1, :, c:c + k]], dim=2),
                       torch.cat([vv[i:i + 1, :, :valid], vv[i:i + 1, :, c:c + k]], dim=2))
                      for kk, vv in kv]
            row_state = _SeqState(row_kv, state.cached[:valid] + [token] + out_tokens[i][:k - 1],
                                  out_alts[i][:k])
            q = (SparseProbs.from_rows(out_dists[i][:k]) if out_dists[i][0] is not None
                 else None)
            out.append((Draft(step.seq_id, out_tokens[i][:k], q), row_state))
        return out

    def _padded_cache(self, kvs: list[KV | None], lens: list[int], lmax: int) -> KV | None:
        """One batch cache: each row's KV right-aligned at lmax, zeros (masked) before it."""
        if lmax == 0:
            return None
        ref = next(kv for kv in kvs if kv is not None)
        layers = []
        for layer, (k0, v0) in enumerate(ref):
            kshape = (len(kvs), k0.shape[1], lmax, k0.shape[3])
            vshape = (len(kvs), v0.shape[1], lmax, v0.shape[3])
            keys = k0.new_zeros(kshape)  # [B, H_kv, Lmax, D]
            values = v0.new_zeros(vshape)
            for i, (kv, n) in enumerate(zip(kvs, lens)):
                if kv is not None and n:
                    keys[i, :, lmax - n:] = kv[layer][0][0]
                    values[i, :, lmax - n:] = kv[layer][1][0]
            layers.append((keys, values))
        return layers
