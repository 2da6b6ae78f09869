"""The sampling state: every running sequence's sampling fields, kept across steps, and what one
step reads of them (`StepSampling`), built once per step.

Per sequence, a slot (given when the sequence first takes part in a step, freed when it leaves):
    scalars      temperature, top-k, top-p, min-p, the penalties' weights, min_tokens: host
                 (CPU) tensors indexed by slot, so the samplers' "does any row need this
                 stage?" checks stay free (kernels/sampling.py) and a step gathers them with
                 one index per field instead of repacking Python lists;
    vocab rows   only for sequences with a logits processor (SamplingParams.has_processors), on
                 the target's device: the output tokens' counts, the prompt-or-output tokens
                 seen, the logit bias, the hard mask (allowed_token_ids) and the single-token
                 bad words. Written when the sequence joins and updated with each token it
                 emits (`emitted`): never rebuilt from the history.

Once per step, `step()` expands the slots to the step's verified rows (kernels.layout's logits
rows: per emitting sequence its root row, then one row per draft node). A processed row's
history is the sequence's committed output plus the drafts on its own path: chain row i sees
drafts[:i], a tree node's row its ancestors and itself, never a sibling. Those drafts are added
to the gathered counts in one scatter; multi-token bad words and min_tokens become the row's
banned ids on the host (both need the row's own suffix and length). A structured request's
grammar (seq.grammar: verifier_service/grammar/matcher.py) writes each of its rows' allowed
tokens after that row's own path into one host bitmask for the step, folded into the rows'
hard mask: every sampler, the argmax and the logprobs read it.

The rejection samplers, the step sampler, the logprobs and the bad-q fallback read the step's
`SamplingTensors` from here; the target's logits pass through `process` first, so the greedy
argmax, the sampled p and the keyed race of a seeded request all see the processed logits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from kernels.layout import StepLayout
from kernels.logits_processors import ProcessorRows, apply_processors
from kernels.sampling import SamplingTensors
from kernels.token_bitmask import banned_from_bitmask
from splitspec.params import SamplingParams

__all__ = ["SamplingState", "StepSampling", "bad_word_ids"]

_FLOATS = ("temperature", "top_p", "min_p", "repetition_penalty", "frequency_penalty",
           "presence_penalty")
_INTS = ("top_k", "min_tokens")


def bad_word_ids(words: Sequence[str], encode) -> tuple[tuple[int, ...], ...]:
    """Each bad word's token ids as the served tokenizer writes it alone and after a space
    (encode: text -> ids without special tokens), as vLLM bans them."""
    out: list[tuple[int, ...]] = []
    for word in words:
        for text in (word.lstrip(), " " + word.lstrip()):
            ids = tuple(encode(text))
            if ids and ids not in out:
                out.append(ids)
    return tuple(out)


@dataclass
class _Rows:
    """A processing sequence's vocabulary rows (row index into the state's dense arrays)."""

    row: int
    bad_words: tuple[tuple[int, ...], ...] = ()  # multi-token words (single ones are in a row)
    stop_ids: tuple[int, ...] = ()  # masked before min_tokens
    prompt_len: int = 0
    single_words: bool = False  # some bad word is one token (banned in its soft row)


class SamplingState:
    """Slots for up to any number of sequences (grown by doubling), on `device` for the vocab
    rows and on the host for the scalars."""

    def __init__(self, vocab: int, device: torch.device, capacity: int = 16):
        self.vocab = vocab
        self.device = device
        self._slot: dict[str, int] = {}  # request id -> slot
        self._free: list[int] = []
        self._rows: dict[str, _Rows] = {}  # request id -> its vocab rows
        self._free_rows: list[int] = []
        self.floats = torch.zeros(len(_FLOATS), 0)
        self.ints = torch.zeros(len(_INTS), 0, dtype=torch.int64)
        self._grow_slots(capacity)
        # vocab rows, allocated with the first processing sequence
        self.counts = torch.zeros(0, vocab, device=device)
        self.seen = torch.zeros(0, vocab, dtype=torch.bool, device=device)
        self.bias = torch.zeros(0, vocab, device=device)
        self.hard = torch.zeros(0, vocab, dtype=torch.bool, device=device)
        self.soft = torch.zeros(0, vocab, dtype=torch.bool, device=device)

    # -- membership ----------------------------------------------------------------------------

    def __contains__(self, seq) -> bool:
        return seq.request_id in self._slot

    @property
    def num_processing(self) -> int:
        return len(self._rows)

    def join(self, seq) -> int:
        """The sequence's slot, written on its first step (its fields, and for a processing
        sequence its vocab rows from the prompt and any output it already has)."""
        slot = self._slot.get(seq.request_id)
        if slot is not None:
            return slot
        if not self._free:
            self._grow_slots(2 * self.floats.shape[1])
        slot = self._slot[seq.request_id] = self._free.pop()
        p: SamplingParams = seq.inp.sampling
        for i, name in enumerate(_FLOATS):
            self.floats[i, slot] = float(getattr(p, name))
        for i, name in enumerate(_INTS):
            self.ints[i, slot] = int(getattr(p, name))
        if p.has_processors:
            self._join_rows(seq, p)
        return slot

    def _join_rows(self, seq, p: SamplingParams) -> None:
        if not self._free_rows:
            self._grow_rows(max(4, 2 * self.counts.shape[0]))
        r = self._free_rows.pop()
        words = getattr(seq, "bad_words_ids", ())
        prompt = list(seq.inp.prompt_token_ids)
        single = [w[0] for w in words if len(w) == 1]
        rows = _Rows(r, tuple(w for w in words if len(w) > 1),
                     tuple(sorted(seq.tracker.stop_token_ids)) if p.min_tokens else (),
                     len(prompt), bool(single))
        self._rows[seq.request_id] = rows
        dev = self.device
        output = seq.tokens[len(prompt):]
        self.counts[r].zero_()
        if output:
            self.counts[r].index_put_((torch.tensor(output, device=dev),),
                                      torch.ones(len(output), device=dev), accumulate=True)
        self.seen[r].zero_()
        self.seen[r, torch.tensor(prompt + output, device=dev)] = True
        self.bias[r].zero_()
        if p.logit_bias:
            ids, values = zip(*p.logit_bias)
            self.bias[r, torch.tensor(ids, device=dev)] = torch.tensor(values, device=dev)
        self.hard[r].zero_()
        if p.allowed_token_ids:
            self.hard[r].fill_(True)
            self.hard[r, torch.tensor(p.allowed_token_ids, device=dev)] = False
        self.soft[r].zero_()
        if single:
            self.soft[r, torch.tensor(single, device=dev)] = True

    def emitted(self, seq, tokens: Sequence[int]) -> None:
        """A sequence's newly committed output tokens (what its later rows count)."""
        rows = self._rows.get(seq.request_id)
        if rows is None or not tokens:
            return
        ids = torch.tensor(list(tokens), device=self.device)
        self.counts[rows.row].index_put_((ids,), torch.ones(len(tokens), device=self.device),
                                         accumulate=True)
        self.seen[rows.row, ids] = True

    def leave(self, seq) -> None:
        """The sequence finished, failed or was aborted: its slot and rows are free."""
        slot = self._slot.pop(seq.request_id, None)
        if slot is not None:
            self._free.append(slot)
        rows = self._rows.pop(seq.request_id, None)
        if rows is not None:
            self._free_rows.append(rows.row)

    def _grow_slots(self, capacity: int) -> None:
        old = self.floats.shape[1]
        self.floats = torch.cat([self.floats, torch.zeros(len(_FLOATS), capacity - old)], 1)
        self.ints = torch.cat([self.ints, torch.zeros(len(_INTS), capacity - old,
                                                      dtype=torch.int64)], 1)
        self._free.extend(range(capacity - 1, old - 1, -1))

    def _grow_rows(self, capacity: int) -> None:
        old = self.counts.shape[0]

        def grown(t):
            return torch.cat([t, torch.zeros(capacity - old, self.vocab, dtype=t.dtype,
                                             device=self.device)])

        self.counts, self.seen, self.bias = grown(self.counts), grown(self.seen), grown(self.bias)
        self.hard, self.soft = grown(self.hard), grown(self.soft)
        self._free_rows.extend(range(capacity - 1, old - 1, -1))

    # -- one step --------------------------------------------------------------------------------

    def step(self, seqs: Sequence, drafts: Sequence, layout: StepLayout) -> "StepSampling":
        """What the step's sampler reads for its emitting sequences `seqs` (in the layout's
        sampler order) and their drafts (host ids and parents)."""
        slots = torch.tensor([self.join(s) for s in seqs], dtype=torch.int64)
        params = [s.inp.sampling for s in seqs]
        step = StepSampling(self, list(seqs), params, slots, layout,
                            self._processor_rows(seqs, drafts, layout))
        for s in seqs:  # finished while the step was planned (an abort, a failed stack)
            if s.finished:
                self.leave(s)
        return step

    def _processor_rows(self, seqs, drafts, layout: StepLayout) -> ProcessorRows | None:
        """The processed rows of the step (None: no emitting sequence has a processor)."""
        procs = [(i, self._rows[s.request_id]) for i, s in enumerate(seqs)
                 if s.request_id in self._rows]
        if not procs:
            return None
        offsets = layout.target_offsets.tolist()
        ks = layout.num_draft_tokens.tolist()
        rows, dense, extra_counts, extra_banned, slots = [], [], [], [], []
        grammars = []  # (first row, grammar, draft tokens, parents)
        for i, r in procs:
            d = drafts[i]
            tokens = list(d.tokens) if d is not None and ks[i] else []
            parents = (list(d.parents) if d is not None and not d.is_chain
                       else list(range(-1, len(tokens) - 1)))
            output = seqs[i].tokens[r.prompt_len:]
            slot = self._slot[seqs[i].request_id]
            grammar = getattr(seqs[i], "grammar", None)
            if grammar is not None:
                grammars.append((len(rows), grammar, tokens, parents))
            for node in range(-1, ks[i]):  # -1: the root row
                path = _path(parents, node)  # the drafts in this row's history, root first
                at = len(rows)
                rows.append(offsets[i] + node + 1)
                dense.append(r.row)
                slots.append(slot)
                extra_counts.extend((at, tokens[n]) for n in path)
                history = [tokens[n] for n in path]
                if r.bad_words:
                    extra_banned.extend((at, w[-1]) for w in r.bad_words
                                        if _ends_with(output, history, w[:-1]))
                if r.stop_ids and self._before_min_tokens(seqs[i], r, slot, path):
                    extra_banned.extend((at, t) for t in r.stop_ids)
        dev = self.device
        dense_t = torch.tensor(dense, device=dev)
        params = [seqs[i].inp.sampling for i, _ in procs]
        # a stage no processed row needs reads nothing (kernels/logits_processors.py skips it)
        counts = seen = None
        if any(p.frequency_penalty or p.presence_penalty for p in params):
            counts = self.counts.index_select(0, dense_t)
        if any(p.repetition_penalty != 1.0 for p in params):
            seen = self.seen.index_select(0, dense_t)
        if extra_counts:
            at, tok = (torch.tensor(c, device=dev) for c in zip(*extra_counts))
            if counts is not None:
                counts.index_put_((at, tok), torch.ones(len(extra_counts), device=dev),
                                  accumulate=True)
            if seen is not None:
                seen[at, tok] = True
        soft = self.soft.index_select(0, dense_t)
        if extra_banned:
            at, tok = (torch.tensor(c, device=dev) for c in zip(*extra_banned))
            soft[at, tok] = True
        slot_t = torch.tensor(slots)
        weight = {name: self.floats[_FLOATS.index(name)].index_select(0, slot_t)
                  .to(dev).unsqueeze(1)
                  for name in ("repetition_penalty", "frequency_penalty", "presence_penalty")}
        any_bias = any(p.logit_bias for p in params)
        any_hard = any(p.allowed_token_ids for p in params)
        hard = self.hard.index_select(0, dense_t) if any_hard else None
        if grammars:  # every row of the others allows every token
            bitmask = torch.full((len(rows), (self.vocab + 31) // 32), -1, dtype=torch.int32)
            for first, grammar, tokens, parents in grammars:
                grammar.fill_rows(tokens, parents, bitmask, first)
            banned = banned_from_bitmask(bitmask.to(dev), self.vocab)
            hard = banned if hard is None else hard | banned
        return ProcessorRows(
            rows=torch.tensor(rows, device=dev), counts=counts, seen=seen,
            repetition=weight["repetition_penalty"], frequency=weight["frequency_penalty"],
            presence=weight["presence_penalty"],
            bias=self.bias.index_select(0, dense_t) if any_bias else None,
            hard=hard,
            soft=soft if extra_banned or any(r.single_words for _, r in procs) else None)

    def _before_min_tokens(self, seq, r: _Rows, slot: int, path: list[int]) -> bool:
        """Whether the token a row picks comes before min_tokens: the row's output so far
        (committed output and the drafts on its path, never the prompt) is shorter."""
        generated = len(seq.tokens) - r.prompt_len + len(path)
        return generated < int(self.ints[_INTS.index("min_tokens"), slot])


def _path(parents: Sequence[int], node: int) -> list[int]:
    """The draft nodes from the root down to `node` inclusive (-1: none)."""
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def _ends_with(output: Sequence[int], history: Sequence[int], prefix: Sequence[int]) -> bool:
    """Whether output + history ends with `prefix` (a bad word's tokens but its last)."""
    tail = list(output[-len(prefix):]) + list(history)
    return len(tail) >= len(prefix) and tuple(tail[-len(prefix):]) == tuple(prefix)


@dataclass
class _Input:
    sampling: SamplingParams
    prompt_token_ids: tuple[int, ...] = ()


class _Bare:
    """A sequence of nothing but its sampling parameters (StepSampling.of)."""

    def __init__(self, request_id: str, params: SamplingParams):
        if params.has_processors:
            raise ValueError("a processor reads the sequence's history: step a real sequence")
        self.request_id, self.inp = request_id, _Input(params)
        self.tokens, self.finished = [], False


@dataclass
class StepSampling:
    """One step's sampling inputs, read by every sampler of the step."""

    state: SamplingState
    seqs: list
    params: list[SamplingParams]
    slots: torch.Tensor  # int64 [S] on the host
    layout: StepLayout
    processors: ProcessorRows | None
    _cache: dict = field(default_factory=dict)

    @classmethod
    def of(cls, params: Sequence[SamplingParams], layout: StepLayout) -> "StepSampling":
        """A step's sampling for sequences given by their parameters alone (no history: no
        processor reads one), e.g. to test a sampler."""
        state = SamplingState(1, torch.device("cpu"), capacity=max(1, len(params)))
        seqs = [_Bare(f"row-{i}", p) for i, p in enumerate(params)]
        return state.step(seqs, [None] * len(seqs), layout)

    @property
    def greedy(self) -> torch.Tensor:
        """bool [S] on the host: rows decided without random numbers."""
        return self.state.floats[0].index_select(0, self.slots) == 0

    @property
    def all_greedy(self) -> bool:
        return bool(self.greedy.all())

    @property
    def seeds(self) -> list[int | None]:
        return [p.seed for p in self.params]

    def tensors(self, per: torch.Tensor | None = None) -> SamplingTensors:
        """SamplingTensors per sequence (per=None), or per row of `per` (int64 [R]: for each
        row, which of the step's sequences it belongs to)."""
        slots = self.slots if per is None else self.slots.index_select(0, per)
        f, i = self.state.floats.index_select(1, slots), self.state.ints.index_select(1, slots)
        return SamplingTensors(temperature=f[0], top_k=i[0], top_p=f[1], min_p=f[2])

    def row_tensors(self) -> SamplingTensors:
        """Per logits row of the step: each sequence's fields on its k + 1 rows."""
        if "rows" not in self._cache:
            rows = self.layout.num_draft_tokens + 1
            self._cache["rows"] = self.tensors(
                torch.repeat_interleave(torch.arange(len(self.params)), rows))
        return self._cache["rows"]

    def process(self, logits: torch.Tensor) -> torch.Tensor:
        """The step's logits [T_out, V] with every processed row processed (the same tensor
        when no row is)."""
        if self.processors is None:
            return logits
        return apply_processors(logits, self.processors)
