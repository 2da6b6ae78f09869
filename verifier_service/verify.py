"""One verification on the model thread: build the step's layout, run the target once over the
packed batch, rejection-sample, hand back what each sequence emits.

Reads top to bottom like the step it is (gpt-fast's speculative_decode, for a ragged batch):
    1. layout   where every sequence's rows sit (kernels.StepLayout), built once;
    2. forward  one target pass: [uncached tokens..., d1..dk] per sequence;
    3. sample   target probabilities p per verified row, then the lossless rejection sampler;
    4. results  per sequence: accepted drafts + one recovered/bonus token, and, for proposers that
                condition on it, the hidden state that produced the last of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from kernels.layout import RejectionResult, StepLayout
from kernels.rejection import rejection_sample
from kernels.sampling import SamplingTensors
from kernels.sparse_probs import SparseProbs
from splitspec.proposal import Draft
from verifier_service.model_runner import ModelRunner
from verifier_service.scheduler import Scheduled


@dataclass
class SeqResult:
    tokens: list[int]  # accepted drafts, then one recovered or bonus token
    num_accepted: int
    hidden: torch.Tensor | None = None  # [H] the state that produced tokens[-1], when asked


def verify_step(runner: ModelRunner, batch: list[Scheduled], drafts: list[Draft | None],
                keep_hidden: list[bool]) -> list[SeqResult | None]:
    """Per batch entry: its SeqResult, or None for a prefill chunk (cached, emits nothing)."""
    # 1. layout
    ks = [len(d.tokens) if d else 0 for d in drafts]
    layout = StepLayout.build([s.num_new + k for s, k in zip(batch, ks)],
                              [s.seq.num_computed for s in batch], ks, [s.samples for s in batch])
    input_ids = [t for s, d in zip(batch, drafts)
                 for t in s.seq.tokens[s.seq.num_computed:s.seq.num_computed + s.num_new]
                 + (d.tokens if d else [])]
    # 2. forward
    logits, hidden = runner.forward(input_ids, [s.seq.blocks for s in batch], layout)
    if not layout.batch_size:
        return [None] * len(batch)
    # 3. sample
    emitting = layout.seq_index.tolist()
    result = sample_step(logits, layout, [batch[i] for i in emitting],
                         [drafts[i] for i in emitting])
    # 4. results
    results: list[SeqResult | None] = [None] * len(batch)
    rows = result.tokens()
    offsets = layout.target_offsets.tolist()
    for r, (i, n_acc) in enumerate(zip(emitting, result.num_accepted.tolist())):
        # row n_acc of this sequence picked its last token: its hidden state produced it
        h = hidden[offsets[r] + n_acc].to("cpu", torch.float32) if keep_hidden[i] else None
        results[i] = SeqResult(rows[r], n_acc, h)
    return results


def sample_step(logits: torch.Tensor, layout: StepLayout, batch: Sequence[Scheduled],
                drafts: Sequence[Draft | None]) -> RejectionResult:
    """logits [T_out, V] of the emitting sequences -> their accepted tokens."""
    params = [s.seq.inp.sampling for s in batch]
    if layout.num_drafts == 0 and all(p.greedy for p in params):
        # plain greedy decoding: the sampler would pick argmax(one-hot at argmax(logits)), the
        # same token; skip building p and the sampler's bookkeeping (the no-speculation path)
        tokens = logits.argmax(dim=-1)  # [S]
        return RejectionResult(tokens[:, None], torch.zeros_like(tokens))
    rows = (layout.num_draft_tokens + 1).tolist()  # logits rows per sequence

    def per_row(values):  # one value per sequence -> one per logits row
        return [v for v, n in zip(values, rows) for _ in range(n)]

    probs = SamplingTensors.from_lists(  # host tensors: the kernel picks its fast paths
        per_row([p.temperature for p in params]), per_row([p.top_k for p in params]),
        per_row([p.top_p for p in params]), per_row([p.min_p for p in params])).apply(logits)
    device = logits.device
    draft_ids = torch.tensor([t for d in drafts if d for t in d.tokens], dtype=torch.long)
    return rejection_sample(
        probs, draft_ids.to(device), layout, draft_distribution(drafts, device),
        torch.tensor([p.greedy for p in params], dtype=torch.bool),  # host: decides draws
        [p.seed for p in params])


def draft_distribution(drafts: Sequence[Draft | None], device: torch.device
                       ) -> SparseProbs | None:
    """None when every draft is one-hot; else all drafts' q rows, one-hot ones as K = 1."""
    if not any(d is not None and d.q is not None for d in drafts):
        return None
    parts = [d.q if d.q is not None else SparseProbs.one_hot(torch.tensor(d.tokens))
             for d in drafts if d is not None and d.tokens]
    return SparseProbs.cat(parts).to(device)
