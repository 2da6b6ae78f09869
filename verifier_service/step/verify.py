"""One verification on the model thread: plan the step, run the target once over the packed
batch, rejection-sample, hand back what each sequence emits.

Reads top to bottom like the step it is (gpt-fast's speculative_decode, for a ragged batch):
    1. plan     where every sequence's rows sit (kernels.StepLayout), and the step's arrays in
                one host buffer (verifier_service/step/plan.py), without touching the device;
                drafts an in-target head left on the device (greedy and sampled chains,
                EAGLE-2 trees) are planned from their node counts and placed over the plan on
                the device: ids, and a tree's positions and ancestor mask
                (verifier_service/step/device_drafts.py; a tensor-parallel step reads them
                back first, its ranks are sent host plans);
    2. execute  one target pass: [uncached tokens..., d1..dk] per sequence, with greedy chain
                verification on the device (verifier_service/step/executor.py: one copy in, a
                replayed graph or the same body run eagerly);
    3. sample   sampled requests and trees: target probabilities p per verified row, then the
                lossless rejection sampler, launched after the forward without a sync (device
                drafts' ids, parents and q read from the device; a q failing its check there
                costs its sequence's speculation only);
    4. fetch    one copy out and the step's one wait, for every method: per sequence,
                accepted drafts + one recovered/bonus token, the accepted path, and, for
                proposers that condition on it, the hidden state that produced the last token;
                for in-target methods the target's argmax after every node (and the drafts'
                ids and trees' parents they left on the device); for requests that ask, each
                emitted token's log-probability from the same logits rows (kernels/logprobs.py;
                no extra forward, one more read back).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from kernels import tree_rejection
from kernels.layout import RejectionResult, StepLayout
from kernels.logprobs import token_logprobs
from kernels.rejection import greedy_verify, rejection_sample
from kernels.sampling import SamplingTensors, noise_key, sample
from kernels.sparse_probs import SparseProbs
from kernels.tree_rejection import TreeResult, tree_rejection_sample
from splitspec.device import to_device
from splitspec.proposal import Draft
from verifier_service.batching.scheduler import Scheduled
from verifier_service.methods.in_target import DeviceDraft, read_back
from verifier_service.step import device_drafts
from verifier_service.step.executor import StepExecutor
from verifier_service.step.sampling_state import StepSampling


@dataclass
class SeqResult:
    tokens: list[int]  # accepted drafts, then one recovered or bonus token
    num_accepted: int
    # fed rows whose K/V the sequence keeps, in order (kv/cache.py keep): its uncached tokens, then
    # the accepted drafts' rows (a chain's: a prefix of what was fed, range(n))
    kept_rows: Sequence[int]
    hidden: torch.Tensor | None = None  # [H] the state that produced tokens[-1], when asked
    # per token, when the request asked: (logprob, [(token id, logprob), ...] most likely first)
    logprobs: list[tuple[float, list[tuple[int, float]]]] | None = None
    # the draft nodes accepted, root first (a chain's: 0 .. num_accepted - 1)
    path: Sequence[int] = ()
    branch_hit: bool = False  # the accepted path left a node's first-ranked child somewhere
    # when asked (in-target methods learn from their own rows): the target's argmax after each
    # draft node, in node order
    node_argmax: Sequence[int] = ()
    # when asked (heads on the target's features): the kept rows' features [len(kept_rows), F],
    # on the target's device
    features: torch.Tensor | None = None


@dataclass
class ChunkFeatures:
    """A prefill chunk's result where its features were asked for: every fed row's [n, F]
    (a chunk emits nothing; its rows are all kept)."""

    features: torch.Tensor


def verify_step(executor: StepExecutor, batch: list[Scheduled], drafts: list[Draft | None],
                keep_hidden: list[bool], keep_argmax: Sequence[bool] = (),
                keep_features: Sequence[bool] = ()) -> list[SeqResult | ChunkFeatures | None]:
    """Per batch entry: its SeqResult, or for a prefill chunk (cached, emits nothing) None, or
    its ChunkFeatures when keep_features asks."""
    # 0. drafts still on the device (an in-target head's: chains, trees, sampled chains with
    # their q) go to the forward and the samplers from there; a tensor-parallel step's ranks
    # are sent host plans, so there they are read back first
    held = device_drafts.held(drafts)
    # (and where a logits processor needs their ids for its rows' histories: their ids on the
    # host, one copy, before the plan)
    if held and (executor.broadcast is not None
                 or any(batch[i].seq.inp.sampling.has_processors for i in held)):
        read_back([drafts[i] for i in held], executor.fetch)
        held = []
    # 1. plan (trees: each node at the position of its depth, seeing its ancestors only; a
    # device tree's shape placed over the plan on the device)
    ks = [len(d.tokens) if d else 0 for d in drafts]
    trees = [None if d is None or d.is_chain else d.parents for d in drafts]
    layout = StepLayout.build([s.num_new + k for s, k in zip(batch, ks)],
                              [s.seq.num_computed for s in batch], ks, [s.emits for s in batch],
                              trees if any(t is not None for t in trees) else None)
    input_ids = [t for s, d in zip(batch, drafts)
                 for t in s.seq.tokens[s.seq.num_computed:s.seq.num_computed + s.num_new]
                 + (d.tokens if d else [])]
    plan = executor.plan(layout, input_ids, [s.seq.blocks.blocks for s in batch])
    if held:
        device_drafts.place(plan, layout, drafts, ks, held, executor.runner.vocab_size,
                            executor.device)
    # 2. execute
    step = executor.execute(plan)
    chunks = _chunk_features(step, plan, batch, keep_features)
    if not layout.batch_size:
        executor.fetch([])  # the step's wait: its writes to the cache are done
        return chunks
    emitting = layout.seq_index.tolist()
    n = len(emitting)
    # 3. sample: the step's sampling state once, the logits rows of requests with a logits
    # processor processed with each row's own history; a step of greedy chains only without a
    # processor is verified already, inside the forward
    sampling = executor.sampling.step([batch[i].seq for i in emitting],
                                      [drafts[i] for i in emitting], layout)
    raw = (step.logits if plan.bucket is None else
           step.logits.index_select(0, step.views["real_rows"][:layout.logits_indices.numel()]))
    ragged = sampling.process(raw)
    nodes = None
    params = sampling.params
    if plan.chain and sampling.all_greedy and sampling.processors is None:
        tokens, num_accepted = step.tokens[:n], step.num_accepted[:n]
    elif plan.chain and not layout.num_drafts and executor.sampler.serves(n):
        # nothing to verify: one token per row, the sampler's graph replayed
        tokens = executor.sampler(ragged, params, layout.sample_positions.tolist())[:, None]
        num_accepted = torch.zeros(n, dtype=torch.int64, device=tokens.device)
    else:
        result = sample_step(ragged, sampling, [drafts[i] for i in emitting])
        tokens, num_accepted = result.output_token_ids, result.num_accepted
        if isinstance(result, TreeResult):
            nodes = result.accepted_nodes
        bad = getattr(result, "bad_q", None)
        if bad is not None:  # a malformed q costs its sequence's speculation only
            tokens, num_accepted, nodes = device_drafts.unaccept(
                bad, tokens, num_accepted, nodes, _root_tokens(ragged, sampling))
    # 4. fetch: the last kept row's hidden state (logits row base + its node + 1), the
    # argmax rows, the tokens: one copy
    base_dev = step.views["bonus_base"][:n]
    wants_hidden = any(keep_hidden[i] for i in emitting)
    wants_argmax = any(keep_argmax[i] for i in emitting if i < len(keep_argmax))
    floats = []
    if wants_hidden:
        if nodes is None or not nodes.shape[1]:
            last = base_dev + num_accepted
        else:
            picked = nodes.gather(1, (num_accepted - 1).clamp(min=0)[:, None])[:, 0]
            last = base_dev + torch.where(num_accepted > 0, picked + 1, 0)
        floats.append(step.hidden.index_select(0, last))
    ints = [tokens, num_accepted] + ([nodes] if nodes is not None else [])
    ints += [step.argmax] if wants_argmax else []
    # the held drafts' ids and trees' parents, read back with the rest
    shipped = [t for i in held for t in (drafts[i].device_tokens, drafts[i].device_parents)
               if t is not None]
    ints += shipped
    got, got_f = executor.fetch(ints, floats)
    back = iter(got[len(got) - len(shipped):])
    for i in held:
        d = drafts[i]
        d.fill(next(back), next(back) if d.device_parents is not None else None)
    got = got[:len(got) - len(shipped)]
    rows_h, n_acc_h = got[0], got[1].tolist()
    nodes_h = got[2] if nodes is not None else None
    argmax_h = got[-1] if wants_argmax else None
    hidden_h = got_f[0] if wants_hidden else None
    base = plan.arrays["bonus_base"][:n]  # the host's copy of the offsets
    # 5. results
    results: list[SeqResult | ChunkFeatures | None] = chunks
    rows = [row[:a + 1].tolist() for row, a in zip(rows_h, n_acc_h)]
    fed_before = (layout.query_lens[layout.seq_index] - layout.num_draft_tokens).tolist()
    for r, (i, n_acc) in enumerate(zip(emitting, n_acc_h)):
        path = nodes_h[r, :n_acc].tolist() if nodes_h is not None else list(range(n_acc))
        kept = (range(batch[i].num_new + n_acc) if nodes_h is None
                else tree_rejection.path_rows(fed_before[r], path))
        h = torch.from_numpy(hidden_h[r]) if keep_hidden[i] else None
        results[i] = SeqResult(rows[r], n_acc, kept, h, path=path,
                               branch_hit=bool(n_acc) and nodes_h is not None
                               and _left_first_child(drafts[i].parents, path))
        if argmax_h is not None and i < len(keep_argmax) and keep_argmax[i]:
            results[i].node_argmax = argmax_h[base[r] + 1:base[r] + 1 + ks[i]].tolist()
    _kept_features(step, plan, emitting, results, keep_features)
    _add_logprobs(raw if executor.logprobs_mode == "raw_logprobs" else ragged, sampling,
                  emitting, rows, results, raw=executor.logprobs_mode == "raw_logprobs")
    return results


def _fed_row(plan, seq: int, fed: int) -> int:
    """The packed row of a sequence's fed row (exact: from query_start; bucket: seq * R)."""
    if plan.bucket is None:
        return int(plan.layout.query_start[seq]) + fed
    return seq * plan.bucket.rows + fed


def _chunk_features(step, plan, batch: list[Scheduled], keep: Sequence[bool]
                    ) -> list[ChunkFeatures | None]:
    """Every non-emitting sequence that asks gets its fed rows' features (device slices)."""
    out: list[ChunkFeatures | None] = [None] * len(batch)
    if step.features is None:
        return out
    for i, s in enumerate(batch):
        if i < len(keep) and keep[i] and not s.emits:
            first = _fed_row(plan, i, 0)
            out[i] = ChunkFeatures(step.features[first:first + s.num_new])
    return out


def _kept_features(step, plan, emitting: list[int], results: list, keep: Sequence[bool]
                   ) -> None:
    """The kept rows' features of each emitting sequence that asks, in one gather."""
    if step.features is None:
        return
    wanted = [i for i in emitting if i < len(keep) and keep[i]]
    if not wanted:
        return
    rows = [_fed_row(plan, i, j) for i in wanted for j in results[i].kept_rows]
    gathered = step.features.index_select(
        0, torch.tensor(rows).to(step.features.device, non_blocking=True))
    at = 0
    for i in wanted:
        n = len(results[i].kept_rows)
        results[i].features = gathered[at:at + n]
        at += n


def _left_first_child(parents: Sequence[int], path: Sequence[int]) -> bool:
    """Whether some accepted node is not its parent's first-ranked child."""
    first: dict[int, int] = {}
    for node, parent in enumerate(parents):
        first.setdefault(parent, node)
    return any(first[parents[node]] != node for node in path)


def _add_logprobs(logits: torch.Tensor, sampling: StepSampling, emitting: list[int],
                  rows: list[list[int]], results: list[SeqResult | None],
                  raw: bool = False) -> None:
    """Row j of an emitting sequence picked its token j: gather those rows of the sequences
    that ask for logprobs and score their tokens (one small batch for the whole step), from
    the processed logits and the request's parameters (the distribution the token was drawn
    from), or with `raw` from the model's logits alone (temperature 1, nothing truncated)."""
    seqs = sampling.seqs
    wanted = [r for r, seq in enumerate(seqs) if seq.inp.top_logprobs is not None]
    if not wanted:
        return
    offsets = sampling.layout.target_offsets.tolist()
    # token j of a sequence was picked by the logits row of the accepted node before it
    picks = {r: [0, *(p + 1 for p in results[emitting[r]].path)] for r in wanted}
    index = [offsets[r] + picks[r][j] for r in wanted for j in range(len(rows[r]))]
    owner = torch.tensor([r for r in wanted for _ in rows[r]])
    scored = token_logprobs(
        logits[torch.tensor(index, device=logits.device)],
        SamplingTensors.from_lists([1.0] * len(owner)) if raw else sampling.tensors(owner),
        torch.tensor([t for r in wanted for t in rows[r]]),
        max(seqs[r].inp.top_logprobs for r in wanted))
    chosen, ids = scored.chosen.tolist(), scored.top_ids.tolist()
    values = scored.top_values.tolist()
    at = 0
    for r in wanted:
        n_top = seqs[r].inp.top_logprobs
        out = []
        for _ in rows[r]:
            out.append((chosen[at], list(zip(ids[at][:n_top], values[at][:n_top]))))
            at += 1
        results[emitting[r]].logprobs = out


def sample_step(logits: torch.Tensor, sampling: StepSampling,
                drafts: Sequence[Draft | None]) -> RejectionResult:
    """logits [T_out, V] of the emitting sequences (processed) -> their accepted tokens.
    Drafts still on the device are read from there (ids, trees' parents, q:
    verifier_service/step/device_drafts.py); the result's bad_q, when set, marks the sequences
    whose q failed the check."""
    layout = sampling.layout
    device = logits.device
    if not layout.chain:
        return _sample_trees(logits, sampling, drafts)
    if sampling.all_greedy:
        # every row greedy: the sampler would pick argmax(one-hot at argmax(logits)); skip
        # building p and the random numbers (the no-speculation path: just the argmax)
        if layout.num_drafts == 0:
            tokens = logits.argmax(dim=-1)  # [S]
            return RejectionResult(tokens[:, None], torch.zeros_like(tokens))
        return greedy_verify(logits, device_drafts.draft_ids(drafts, device), layout)
    probs = sampling.row_tensors().apply(logits)
    if layout.num_drafts == 0:
        return _sample_tokens(logits, probs, layout, sampling.params)
    bad, qs = device_drafts.q_guard(drafts, device)
    result = rejection_sample(
        probs, device_drafts.draft_ids(drafts, device), layout,
        draft_distribution(drafts, device, qs),
        sampling.greedy,  # host: decides draws
        sampling.seeds)
    result.bad_q = bad
    return result


def _root_tokens(logits: torch.Tensor, sampling: StepSampling) -> torch.Tensor:
    """Each emitting sequence's token drawn from the target at its root row alone (what it
    emits with no draft: `_sample_tokens` over its first logits row) [S]."""
    layout = sampling.layout
    rows = to_device(layout.target_offsets, logits.device)
    root = logits.index_select(0, rows)
    one = StepLayout.for_drafts([0] * layout.batch_size, layout.sample_positions)
    probs = sampling.tensors().apply(root)
    return _sample_tokens(root, probs, one, sampling.params).output_token_ids[:, 0]


def _sample_tokens(logits: torch.Tensor, probs: torch.Tensor, layout: StepLayout, params
                   ) -> RejectionResult:
    """sample_step for a step with no drafts and a sampled row (speculation off, or every draft
    dropped): one token per row, what the rejection sampler gives a row with nothing to verify
    in about half the launches. A seeded row takes the keyed race at its position (the token
    its coupled verification emits there: seeded output stays the same on and off), an unseeded
    row a race with fresh noise, a greedy row its argmax."""
    positions = layout.sample_positions.tolist()
    keys = [noise_key(p.seed, at) if p.seed is not None and not p.greedy else None
            for p, at in zip(params, positions)]
    tokens = sample(probs, keys)
    greedy = [i for i, p in enumerate(params) if p.greedy]
    if greedy:  # the argmax itself, not a race over its one-hot p
        tokens = torch.where(
            to_device(torch.tensor([p.greedy for p in params]), logits.device),
            logits.argmax(dim=-1), tokens)
    return RejectionResult(tokens[:, None], torch.zeros_like(tokens))


def _sample_trees(logits: torch.Tensor, sampling: StepSampling, drafts) -> TreeResult:
    """sample_step for a step with a tree among its drafts (kernels/tree_rejection.py; chains in
    the same step are trees with parents i - 1). A tree still on the device: every tree's
    parents go to the sampler as a tensor (DeviceParents), else the layout's are read."""
    layout = sampling.layout
    device = logits.device
    ids = device_drafts.draft_ids(drafts, device)
    greedy = sampling.greedy
    parents = (device_drafts.tree_parents(drafts, device)
               if any(isinstance(d, DeviceDraft) and d.device_tree for d in drafts) else None)
    if bool(greedy.all()):  # argmax of the logits is the argmax of the one-hot p
        return tree_rejection_sample(logits, ids, parents, layout, None, greedy)
    bad, qs = device_drafts.q_guard(drafts, device)
    result = tree_rejection_sample(sampling.row_tensors().apply(logits), ids, parents, layout,
                                   draft_distribution(drafts, device, qs), greedy,
                                   sampling.seeds)
    result.bad_q = bad
    return result


def draft_distribution(drafts: Sequence[Draft | None], device: torch.device,
                       qs: Sequence[SparseProbs | None] | None = None) -> SparseProbs | None:
    """None when every draft is one-hot; else all drafts' q rows, one-hot ones as K = 1.
    qs: each draft's q as checked (device_drafts.q_guard; default: the drafts' own)."""
    qs = [d.q if d is not None else None for d in drafts] if qs is None else qs
    if not any(d is not None and q is not None for d, q in zip(drafts, qs)):
        return None
    parts = [(q if q is not None
              else SparseProbs.one_hot(device_drafts.draft_ids([d], device))).to(device)
             for d, q in zip(drafts, qs) if d is not None and d.tokens]
    return SparseProbs.cat(parts)
