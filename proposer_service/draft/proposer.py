"""Draft-model proposer: a small causal LM with its own KV cache per sequence (resident in a slot
of one preallocated cache while a slot is free).

Per sequence the session (proposer_service/draft/session.py) keeps the token history (rebuilt
from the verifier's deltas) and the draft model's KV for a prefix of it
(proposer_service/draft/cache.py). One step:

    1. apply the delta (accepted drafts + the recovered or bonus token);
    2. roll the KV back to the longest prefix that is still valid: last step the draft cached
       its own draft tokens d1..d_{k-1}, and the verifier kept only some of them;
    3. feed the history tokens not cached yet: the new last token, and when every draft was
       accepted also d_k, which the draft sampled but never fed (the bonus-token case);
       d1 comes from the logits at the last of them;
    4. draft the rest autoregressively: iteration j feeds d_j and picks d_{j+1}.

Steps 3 and 4 run as one batch over all sequences of the step: the first iteration feeds each
row's not-yet-cached tokens (right-padded to the longest; 1 token normally, 2 in the bonus case)
and reads the logits at the row's last real position, and each row has its own positions. Only a
long catch-up (a (re)sync: the whole prompt) is prefilled per sequence first, so that one long
prompt does not pad every row.

Where the caches live (proposer_service/draft/slots.py): a sequence that owns a slot of the
resident cache is drafted in it, its new columns written in place past its length, nothing
copied in or out (rollback is a length change); on a device with graphs through the captured
loop over the same cache (graphs.py). A sequence without a slot (none free, or it outgrew one)
drafts on the per-sequence path: the caches left-padded into one batch cache (zeros, masked out)
built per call, O(batch x longest history) of copies, and the rows cut out again after; at batch
1 its own buffers written in place. Drafting ahead for one sequence's outcomes (`draft_shared`)
needs no padding: its rows are prefixes of one cache, copied once.

Both run the one drafting loop (proposer_service/draft/loop.py); draft tokens are chosen by
proposer_service/sampling.py (argmax for greedy requests; for sampled ones a token drawn
from the top-K-truncated q, K = --draft-top-k, sent with exactly that q).
"""

from __future__ import annotations

import logging
import threading

import torch

from kernels.sparse_probs import SparseProbs
from proposer_service.base import Proposer, load_learned
from proposer_service.draft.cache import KV, Buffers, SeqState, common_prefix, padded_cache, row_kv
from proposer_service.draft.graphs import DraftGraphs, scratch_rows
from proposer_service.draft.loop import draft_loop
from proposer_service.draft.prefix import DraftPrefixCache
from proposer_service.draft.session import DraftSession
from proposer_service.draft.slots import DraftSlots
from proposer_service.sampling import offsets_wanted
from splitspec.device import HostFetch, supports_graphs
from splitspec.device import to_device as _to
from splitspec.graphs import EagerFallbacks
from splitspec.lean_llama import LeanDecoder
from splitspec.proposal import Draft, ProposerDescription, SequenceStep

__all__ = ["DraftModelProposer", "DraftSession"]

log = logging.getLogger(__name__)


class DraftModelProposer(Proposer):
    def __init__(self, model, device: torch.device, vocab_size: int, tokenizer_fingerprint: str,
                 model_name: str = "", max_k: int = 16, draft_top_k: int = 32,
                 max_batch: int = 32, idle_timeout_s: float = 600.0, drafts_ahead: bool = True,
                 ahead_rejections: int = 3, linear: str = "auto",
                 vocab_subset: torch.Tensor | None = None, prefix_cache_mb: int = 256,
                 cache_slots: int = 64, cache_mb: int = 512, chain_ks: tuple[int, ...] = ()):
        """vocab_subset: token ids the draft's head scores (kernels/vocab_subset.py), None for
        the whole vocabulary; needs the lean forward. prefix_cache_mb: memory for finished
        sequences' draft caches (proposer_service/draft/prefix.py; 0: none). cache_slots,
        cache_mb: sequences whose cache is resident (proposer_service/draft/slots.py), at most
        as many as cache_mb holds (0: every sequence keeps its own tensors, the per-sequence
        path). chain_ks: k values whose whole drafting loop is captured as one graph
        (graphs.py)."""
        if draft_top_k < 1:
            raise ValueError("draft_top_k must be >= 1")
        self.model = model
        self.device = device
        if device.type != "cpu":
            self.warm_lengths = (16, 48, 130)
        # The draft's forward: plain tensor ops where the architecture allows
        # (splitspec/lean_llama.py), else the transformers forward.
        supported = LeanDecoder.supports(model)
        if vocab_subset is not None and not supported:
            raise ValueError("a vocabulary subset needs a Llama-family draft (the lean forward); "
                             "pass --vocab-subset 0")
        # drafts need no batch-invariant numbers (kernels/linear.py): auto reads fewest bytes
        self.lean = (LeanDecoder(model, linear, vocab_subset, invariant=False) if supported
                     else None)
        self.vocab_size = vocab_size
        self.fingerprint = tokenizer_fingerprint
        self.model_name = model_name
        self.max_k = max_k
        self.max_batch = max(1, max_batch)
        self.draft_top_k = draft_top_k
        self.idle_timeout_s = idle_timeout_s
        # Positions the draft can encode; longer sequences get no drafts (the target may have a
        # longer context than its draft).
        self.max_positions = getattr(model.config, "max_position_embeddings", None) or 2**31
        # Catch-ups up to this many tokens (the usual 1-2 after a verification step) run inside
        # the batched first iteration; longer ones ((re)syncs: whole prompts) are prefilled per
        # sequence, so one long prompt does not pad every row of the batch to its length.
        self.max_batched_catch_up = 8
        # Drafting ahead: for all-accepted plus this many rejection outcomes (the likeliest
        # by the draft's own probabilities) per sequence, in one batch while the verifier
        # verifies. Each row costs every forward of the batch a little: a few cover most of the
        # probability.
        self.drafts_ahead = drafts_ahead
        self.ahead_rejections = ahead_rejections
        self.fetch = HostFetch(device)  # a drafting loop's one copy back
        self.fallbacks = EagerFallbacks("the draft loop")  # steps the graphs did not serve
        self._build_caches(cache_slots, cache_mb, chain_ks)
        # a new sequence starts from the draft cache of one that began the same way
        self.prefixes = DraftPrefixCache(prefix_cache_mb << 20)

    def _build_caches(self, slots: int, mb: int, chain_ks: tuple[int, ...] = ()) -> None:
        """The resident cache (`slots` sequences of min(max positions, 4096) columns, fewer when
        `mb` holds fewer) and the captured loop over it. No slots without the lean forward; the
        captured loop where the device has graphs (captured by warm_up), with scratch rows of
        its own in the same cache."""
        self.slots, self.graphs = None, None
        if self.lean is None:
            return
        capacity = min(self.max_positions, 4096)
        slots = max(0, min(slots, (mb << 20) // DraftSlots.slot_bytes(self.lean, capacity)))
        graph_batch = min(self.max_batch, 32)
        wants_graphs = supports_graphs(self.device)
        scratch = scratch_rows(graph_batch) if wants_graphs else 0
        if slots or scratch:
            self.slots = DraftSlots(self.lean, self.device, slots, capacity, scratch)
        if wants_graphs:
            # drafting (greedy and sampled) replayed as device graphs
            self.graphs = DraftGraphs(self.lean, self.device, capacity, graph_batch, self.max_k,
                                      top_k=self.draft_top_k, slots=self.slots,
                                      chain_ks=chain_ks)

    @classmethod
    def from_config(cls, config) -> "DraftModelProposer":
        """The registry's constructor: flags -> load()."""
        proposer = load_learned(cls, config)
        mb = config.prefix_cache_memory_mb if config.enable_prefix_caching else 0
        proposer.prefixes = DraftPrefixCache(mb << 20)
        proposer._build_caches(config.draft_cache_slots, config.draft_cache_memory_mb,
                               config.draft_graph_chain_k)
        return proposer

    @classmethod
    def load(cls, path: str, device: torch.device, dtype: torch.dtype, tokenizer: str = "",
             trust_remote_code: bool = False, vocab_subset: str = "auto",
             load_format: str = "auto", load_seed: int = 0,
             **kwargs) -> "DraftModelProposer":
        from splitspec.modelio import (
            load_causal_lm,
            load_tokenizer,
            model_name,
            tokenizer_fingerprint,
        )
        from splitspec.vocab_frequencies import resolve_subset

        model = load_causal_lm(path, device, dtype, trust_remote_code, load_format=load_format,
                               seed=load_seed)
        tok = load_tokenizer(tokenizer or path, trust_remote_code, load_format)
        vocab = model.get_output_embeddings().weight.shape[0]
        if vocab_subset == "auto" and not LeanDecoder.supports(model):
            subset = None  # auto keeps the whole head where there is no lean forward
            log.info("no lean forward for this draft: its output head scores every token")
        else:
            subset = resolve_subset(path, vocab_subset, vocab)
        return cls(model, device, vocab, tokenizer_fingerprint(tok), model_name(path),
                   vocab_subset=subset, **kwargs)

    def warm_up(self) -> None:
        super().warm_up()
        if self.graphs is not None:
            self.graphs.capture()

    def describe(self) -> ProposerDescription:
        return ProposerDescription(method="draft", vocab_size=self.vocab_size,
                                   tokenizer_fingerprint=self.fingerprint,
                                   max_num_speculative_tokens=self.max_k, model=self.model_name,
                                   drafts_ahead=self.offers_drafting_ahead)

    @property
    def offers_drafting_ahead(self) -> bool:
        """Drafting ahead runs the eager loop (a row per likely outcome, k + 1 forwards with a
        read-back each); where the proposal itself replays captured graphs that costs several
        times the proposal it would hide, and the verifier waits for it whenever an outcome
        may hit (on an H100 the draft's steps spent 24-35 ms proposing with it, against 2-3.5 ms
        for a replayed proposal). So only a proposer that drafts eagerly offers it."""
        return self.drafts_ahead and not (self.graphs is not None and self.graphs.captured)

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
        if isinstance(kv, Buffers):
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
    def _feed(self, state: SeqState, tokens: list[int]) -> None:
        """Append tokens to one sequence's cache (catch-up and (re)sync prefill)."""
        if not tokens:
            return
        start = state.length()
        ids = _to(torch.tensor([tokens], dtype=torch.long), self.device)  # [1, S]
        pos = torch.arange(start, start + len(tokens), device=self.device)[None]  # [1, S]
        if state.slot is not None:  # written into its slot in place
            slot = [state.slot]
            self.slots.forward(ids, pos, slot, _to(torch.tensor(slot), self.device), pos[:, 0],
                               start + len(tokens), None, start)
            state.cached.extend(tokens)
            self.slots.refresh(state)
            return
        _, state.kv = self._forward(ids, pos, state.kv, None, 1)
        state.store = None  # new tensors
        state.cached.extend(tokens)

    def bind(self, state: SeqState) -> None:
        """A new sequence's state: into a slot of the resident cache when one is free (else it
        keeps its own tensors and drafts on the per-sequence path)."""
        if self.slots is not None:
            self.slots.bind(state)

    def unbind(self, state: SeqState | None, keep_cache: bool = False) -> None:
        """A state's slot back to the free list (keep_cache: its cache copied out first)."""
        if self.slots is not None:
            self.slots.unbind(state, keep_cache)


    @torch.inference_mode()
    def draft_batch(self, work: list[tuple[SequenceStep, list[int], SeqState]],
                    cancel: threading.Event | None = None) -> list[Draft] | None:
        """Catch every sequence up to its history and draft its k tokens, all rows together:
        through the captured loop where it serves the step, else the rows that own a slot over
        the resident cache and the others on the per-sequence path (`_draft_own`). Each row
        drafts step.k tokens. Returns None once cancel is set (a state's cache intact up to its
        length: what was written into a slot lies past it)."""
        for _, history, state in work:
            # Longest cached prefix still valid; the last history token is never cached here.
            state.truncate(min(common_prefix(state.cached, history), len(history) - 1))
            if (state.slot is not None and len(history) + self.max_batched_catch_up + self.max_k
                    > self.slots.capacity):  # outgrows its slot: its own tensors from now on
                self.unbind(state, keep_cache=True)
            if len(history) - state.length() > self.max_batched_catch_up:
                self._feed(state, history[state.length():-1])  # a (re)sync: prefill alone
        ks = [step.k for step, _, _ in work]
        # the captured loop has no input for a logit bias or allowed ids: such rows run eagerly
        if (self.graphs is not None and self.graphs.captured
                and not offsets_wanted([step.sampling for step, _, _ in work])):
            lens = [state.length() for _, _, state in work]
            pending = [h[n:] for (_, h, _), n in zip(work, lens)]
            b, s0, kmax = len(work), max(len(p) for p in pending), max(ks)
            why = self.graphs.why_not(b, s0, max(lens), kmax)
            if not why:
                return self._draft_replayed(work, lens, pending, ks, kmax)
            self.fallbacks.record(why, rows=b, width=s0, k=kmax)
        resident = [i for i, (_, _, state) in enumerate(work) if state.slot is not None]
        if resident:
            return self._split(work, resident, cancel)
        return self._draft_own(work, cancel)

    def _split(self, work, resident: list[int], cancel: threading.Event | None
               ) -> list[Draft] | None:
        """draft_batch with the rows that own a slot drafted over the resident cache and the
        others (no slot free for them) on the per-sequence path."""
        own = [i for i in range(len(work)) if i not in set(resident)]
        drafts = self._draft_resident([work[i] for i in resident], cancel)
        rest = self._draft_own([work[i] for i in own], cancel) if own else []
        if drafts is None or rest is None:
            return None
        out: list[Draft | None] = [None] * len(work)
        for i, d in zip(resident + own, drafts + rest):
            out[i] = d
        return out

    def _draft_resident(self, work, cancel: threading.Event | None) -> list[Draft] | None:
        """draft_batch's rows that own slots: each row's pending tokens and drafts written into
        its slot past its length, nothing copied in or out; rollback next step is a length
        change. The same drafts as the per-sequence path."""
        slots = [state.slot for _, _, state in work]
        ks = [step.k for step, _, _ in work]
        lens = [state.length() for _, _, state in work]
        pending = [h[n:] for (_, h, _), n in zip(work, lens)]
        b, kmax = len(work), max(ks)
        s0 = max(len(p) for p in pending)
        ids = torch.zeros(b, s0, dtype=torch.long)  # [B, s0], right-padded
        for i, p in enumerate(pending):
            ids[i, :len(p)] = torch.tensor(p)
        pos = _to(torch.tensor(lens)[:, None] + torch.arange(s0), self.device)  # [B, s0]
        slot_t = _to(torch.tensor(slots), self.device)
        last = _to(torch.tensor([len(p) - 1 for p in pending]), self.device)  # [B]
        ends = [n + len(p) for n, p in zip(lens, pending)]  # d1's column

        def forward(ids: torch.Tensor, pos: torch.Tensor, j: int) -> torch.Tensor:
            # a column is a position: row i's query s sits at column pos[i, s]
            if j == 0:
                return self.slots.forward(ids, pos, slots, slot_t, pos[:, 0],
                                          max(lens) + s0, last, lens[0])
            return self.slots.forward(ids, pos, slots, slot_t, pos[:, 0], max(ends) + j, None,
                                      ends[0] + j - 1)

        drafted = draft_loop(forward, _to(ids, self.device), pos, ends,
                             [step.sampling for step, _, _ in work], kmax, self.draft_top_k,
                             cancel, fetch=self.fetch)
        if drafted is None:  # the written columns lie past each state's length: harmless
            return None
        drafts = []
        for i, ((step, history, state), k) in enumerate(zip(work, ks)):
            state.cached = history + drafted.tokens[i][:k - 1]
            self.slots.refresh(state)
            state.alternatives = drafted.alternatives[i][:k]
            drafts.append(drafted.draft(i, step.seq_id, k))
        return drafts

    def _draft_own(self, work, cancel: threading.Event | None) -> list[Draft] | None:
        """draft_batch's rows over their own caches (the per-sequence path). Row i of the batch
        (columns = positions in the batch cache):
            [left pad][cached_i][pending_i][right pad][d1 .. d_{kmax-1}]
             <---- lmax ------> <------- s0 ------->
        pending_i are the history tokens not cached yet (the last one always among them); all
        of them go in iteration 0, whose logits are read at each row's last real position. Pads
        are zero KV or masked-out queries: every query still sees at least its own token."""
        ks = [step.k for step, _, _ in work]
        lens = [state.length() for _, _, state in work]
        pending = [h[n:] for (_, h, _), n in zip(work, lens)]
        b, lmax, kmax = len(work), max(lens), max(ks)
        s0 = max(len(p) for p in pending)
        # One row (batch-1 decoding): its own cache as is, no padding, no mask, nothing to cut
        # out afterwards.
        single = b == 1
        kv = (work[0][2].kv if single
              else padded_cache([state.kv for _, _, state in work], lens, lmax))
        if single and kv is not None and self.lean is not None:
            # lean and one row: the new columns go into the state's own buffers in place (no
            # copy), or the cache is copied once into buffers with room to spare
            state, need = work[0][2], lmax + s0 + kmax - 1
            if state.store is not None and state.store[0][0].shape[2] >= need:
                kv = Buffers(state.store, lmax)
            else:
                room = min(max(need, 2 * lmax), max(need, self.max_positions))
                kv = Buffers(self.lean.buffers(kv, 1, room), lmax)
        mask = torch.zeros(b, lmax + s0 + kmax - 1, dtype=torch.bool)  # [B, columns]
        ids = torch.zeros(b, s0, dtype=torch.long)  # [B, s0], right-padded
        for i, (n, p) in enumerate(zip(lens, pending)):
            mask[i, lmax - n:lmax + len(p)] = True
            mask[i, lmax + s0:] = True
            ids[i, :len(p)] = torch.tensor(p)
        mask = _to(mask, self.device)
        pos = _to(torch.tensor(lens)[:, None] + torch.arange(s0), self.device)  # [B, s0]
        rows = torch.arange(b, device=self.device)
        last = _to(torch.tensor([len(p) - 1 for p in pending]), self.device)  # [B]

        def forward(ids: torch.Tensor, pos: torch.Tensor, j: int) -> torch.Tensor:
            nonlocal kv
            out, kv = self._forward(ids, pos, kv, None if single else mask[:, :lmax + s0 + j],
                                    ids.shape[1])
            return out[rows, last] if j == 0 else out[:, -1]  # [B, V]

        drafted = draft_loop(forward, _to(ids, self.device), pos, [len(h) for _, h, _ in work],
                             [step.sampling for step, _, _ in work], kmax, self.draft_top_k,
                             cancel, fetch=self.fetch)
        if drafted is None:
            return None
        # Keep per row: its cached prefix, its pending tokens, d1..d_{k_i - 1} (d_{k_i} is
        # drafted, not fed); drop the pads and the drafts beyond its own k.
        drafts = []
        for i, ((step, history, state), k, n, p) in enumerate(zip(work, ks, lens, pending)):
            if single:  # [cached][pending][d1 .. d_{k-1}]: all of it is kept
                state.kv = kv.view() if isinstance(kv, Buffers) else kv
                state.store = kv.kv if isinstance(kv, Buffers) else None
            else:
                state.kv = row_kv(kv, i, [(lmax - n, lmax + len(p)),
                                          (lmax + s0, lmax + s0 + k - 1)])
                state.store = None
            state.cached = history + drafted.tokens[i][:k - 1]
            state.alternatives = drafted.alternatives[i][:k]
            drafts.append(drafted.draft(i, step.seq_id, k))
        return drafts

    def _draft_replayed(self, work, lens: list[int], pending: list[list[int]], ks: list[int],
                        kmax: int) -> list[Draft]:
        """draft_batch's steps through the captured loop (proposer_service/draft/graphs.py):
        the same drafts (seeded rows: the very tokens; unseeded: draws from the same q) and
        states as the eager loop leaves."""
        tokens, alternatives, kvs, dists = self.graphs.draft(
            [state.kv for _, _, state in work], lens, pending, [len(h) for _, h, _ in work],
            kmax, [step.sampling for step, _, _ in work], [state.slot for _, _, state in work])
        drafts = []
        for i, ((step, history, state), k, n, p) in enumerate(zip(work, ks, lens, pending)):
            end = n + len(p) + k - 1  # cached + pending + d1 .. d_{k-1}
            state.cached = history + tokens[i][:k - 1]
            if state.slot is not None:  # drafted in its slot: a length change
                self.slots.refresh(state)
            else:
                state.kv = [(kb[:, :, :end], vb[:, :, :end]) for kb, vb in kvs[i]]
                state.store = None
            state.alternatives = alternatives[i][:k]
            q = None if dists[i] is None else SparseProbs.from_rows(dists[i][:k])
            drafts.append(Draft(step.seq_id, tokens[i][:k], q=q))
        return drafts

    @torch.inference_mode()
    def draft_shared(self, step: SequenceStep, rows: list[tuple[int, int, int]],
                     state: SeqState, cancel: threading.Event, guess_row: int | None = None
                     ) -> list[tuple[Draft, SeqState]] | None:
        """Draft several continuations of prefixes of one sequence's cache in one batch, with
        no copy of the cache per row: row (valid, token, k) continues the first `valid` cached
        tokens with `token` (at position valid) and drafts k tokens. Every row reads the shared
        columns through its key mask, so they differ only in their own new columns. Returns
        per row its draft and the state a fresh draft would have left (None once cancel is set).
        The first token of row `guess_row` is a guess, not a draft (the bonus token of the
        all-accepted outcome). Needs the lean forward."""
        c, b = state.length(), len(rows)
        kmax = max(k for _, _, k in rows)
        if (guess_row is None and self.graphs is not None and self.graphs.captured
                and not offsets_wanted([step.sampling])):
            why = self.graphs.why_not(b, 1, max(valid for valid, _, _ in rows), kmax)
            if not why:
                return self._shared_replayed(step, rows, state)
            self.fallbacks.record(why, rows=b, width=1, k=kmax)
        kv = self.lean.buffers(state.kv, b, c + kmax)  # the shared columns copied once
        key_mask = torch.zeros(b, c + kmax, dtype=torch.bool)  # [B, columns]
        for i, (valid, _, _) in enumerate(rows):
            key_mask[i, :valid] = True
        key_mask[:, c:] = True
        key_mask = _to(key_mask, self.device)
        ids = _to(torch.tensor([[t] for _, t, _ in rows]), self.device)  # [B, 1]
        pos = _to(torch.tensor([[valid] for valid, _, _ in rows]), self.device)  # [B, 1]

        def forward(ids: torch.Tensor, pos: torch.Tensor, j: int) -> torch.Tensor:
            logits, _ = self.lean.forward(ids, pos, kv, key_mask[:, :c + j + 1], 1, length=c + j)
            return logits[:, -1]  # [B, V]

        drafted = draft_loop(forward, ids, pos, [valid + 1 for valid, _, _ in rows],
                             [step.sampling] * b, kmax, self.draft_top_k, cancel, guess_row,
                             self.fetch)
        if drafted is None:
            return None
        out = []
        for i, (valid, token, k) in enumerate(rows):
            row_state = SeqState(row_kv(kv, i, [(0, valid), (c, c + k)]),
                                 state.cached[:valid] + [token] + drafted.tokens[i][:k - 1],
                                 drafted.alternatives[i][:k])
            out.append((drafted.draft(i, step.seq_id, k), row_state))
        return out

    def _shared_replayed(self, step: SequenceStep, rows: list[tuple[int, int, int]],
                         state: SeqState) -> list[tuple[Draft, SeqState]]:
        """draft_shared through the captured loop (a token tree's leaves grown on a device):
        each row's prefix of the shared cache copied into its batch row, the row's token its
        pending input; the same drafts and states as the eager path leaves."""
        kmax = max(k for _, _, k in rows)
        tokens, alternatives, kvs, dists = self.graphs.draft(
            [state.kv] * len(rows), [valid for valid, _, _ in rows],
            [[token] for _, token, _ in rows], [valid + 1 for valid, _, _ in rows], kmax,
            [step.sampling] * len(rows))
        out = []
        for i, (valid, token, k) in enumerate(rows):
            row_state = SeqState([(kb[:, :, :valid + k], vb[:, :, :valid + k])
                                  for kb, vb in kvs[i]],
                                 state.cached[:valid] + [token] + tokens[i][:k - 1],
                                 alternatives[i][:k])
            q = None if dists[i] is None else SparseProbs.from_rows(dists[i][:k])
            out.append((Draft(step.seq_id, tokens[i][:k], q=q), row_state))
        return out

