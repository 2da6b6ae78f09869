"""The per-step exchange between verifier and proposers, as dataclasses plus their protobuf edge.

A `SequenceStep` tells a proposer what happened to one sequence since it last heard of it and
how many draft tokens are wanted; a `Draft` is the answer: token ids and, for sampled drafts,
the q they were drawn from as one `kernels.SparseProbs` ([k, K] tensors, the type the rejection
sampler reads). Both sides convert at their edge with the functions below, so the services work
on these types only. Layers, wire to kernel:
    protobuf SequenceDraft --draft_from_pb--> Draft(tokens, q: SparseProbs) --engine--> kernels
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np
import torch

from kernels.sparse_probs import SparseProbs
from protos import common_pb2
from protos import proposer_pb2 as pb
from splitspec.errors import InvalidArgument
from splitspec.params import SamplingParams
from splitspec.wire import sampling_from_pb, sampling_to_pb

_NP_DTYPES = {"float32": np.float32, "float16": np.float16}
_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class SequenceStep:
    seq_id: str
    new_tokens: list[int]
    history_len: int  # length of the history after appending new_tokens
    k: int
    full_history: bool = False
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.0))
    hidden_state: torch.Tensor | None = None  # [hidden], MLP speculator only
    # After answering, draft ahead for this sequence's likely next outcomes (drafting ahead).
    draft_ahead: bool = False
    # 1: a chain (must not branch); > 1: a node may have up to max_branch children (k is then
    # the node budget: at most k nodes).
    max_branch: int = 1
    # The n-gram proposer's match range for this sequence (the request's prompt lookup shape);
    # 0: the proposer's own --ngram-min / --ngram-max.
    ngram_min: int = 0
    ngram_max: int = 0


@dataclass
class Draft:
    seq_id: str
    tokens: list[int] = field(default_factory=list)
    # None: deterministic drafts (one-hot); else q [len(tokens), K], row j the distribution
    # tokens[j] was drawn from.
    q: SparseProbs | None = None
    resync: bool = False  # the proposer lost or distrusts its state: resend the full history
    # AHEAD_HIT: answered from drafting ahead; AHEAD_MISS: drafted ahead for other
    # outcomes, drafted afresh; "": nothing drafted ahead. The verifier marks a hit it took from
    # a push (AheadDraft) AHEAD_PUSHED.
    ahead_outcome: str = ""
    # One parent per token: a local node index, -1 = the root (the sequence's last token);
    # topological (parents[i] < i), siblings in rank order (best first). None: the chain.
    parents: list[int] | None = None

    def __post_init__(self):
        if self.parents is None:
            self.parents = list(range(-1, len(self.tokens) - 1))

    @property
    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    def tree_error(self, max_nodes: int, max_branch: int) -> str | None:
        """Why this draft is not a tree a step asking for at most max_nodes nodes and max_branch
        children per node may verify (None: it is)."""
        if len(self.parents) != len(self.tokens):
            return f"{len(self.parents)} parents for {len(self.tokens)} tokens"
        if len(self.tokens) > max_nodes:
            return f"{len(self.tokens)} nodes, at most {max_nodes} asked"
        if any(not -1 <= p < i for i, p in enumerate(self.parents)):
            return "a parent is not an earlier node or the root"
        if _most_children(self.parents) > max(1, max_branch):
            return f"a node has more than {max(1, max_branch)} children"
        return None


AHEAD_HIT, AHEAD_MISS, AHEAD_PUSHED = "hit", "miss", "pushed"
_OUTCOME_TO_PB = {"": pb.AHEAD_NONE, AHEAD_HIT: pb.AHEAD_HIT,
                  AHEAD_MISS: pb.AHEAD_MISS}
_OUTCOME_FROM_PB = {v: k for k, v in _OUTCOME_TO_PB.items()}


@dataclass(frozen=True)
class AheadDraft:
    """A draft made ahead for one outcome of the step being verified, pushed to the verifier:
    it serves the step whose message says new_tokens == outcome at history_len, cut to its k
    (a chain step needs k tokens of it; a tree step's k is a node budget it may leave unfilled)."""

    history_len: int
    outcome: tuple[int, ...]
    draft: Draft  # draft.seq_id names the sequence

    def serves(self, step: SequenceStep) -> bool:
        return (not step.full_history and step.history_len == self.history_len
                and tuple(step.new_tokens) == self.outcome
                and (step.k <= len(self.draft.tokens) or step.max_branch > 1)
                and _most_children(self.draft.parents[:step.k]) <= max(1, step.max_branch))

    def taken(self, k: int) -> Draft:
        """The draft for a step that asks k tokens (k <= its length): its first k nodes (a tree
        is topological, so they keep every parent)."""
        d = self.draft
        q = None if d.q is None else SparseProbs.from_rows(d.q.rows()[:k])
        return Draft(d.seq_id, d.tokens[:k], q, ahead_outcome=AHEAD_PUSHED,
                     parents=d.parents[:k])


def _most_children(parents: list[int]) -> int:
    """The most children any node (the root included) has in a tree given by its parents."""
    counts: dict[int, int] = {}
    for p in parents:
        counts[p] = counts.get(p, 0) + 1
    return max(counts.values(), default=0)


@dataclass(frozen=True)
class ProposerDescription:
    method: str
    vocab_size: int = 0  # 0: any vocabulary
    tokenizer_fingerprint: str = ""  # empty: any tokenizer
    max_num_speculative_tokens: int = 16
    needs_hidden_state: bool = False
    model: str = ""
    drafts_ahead: bool = False  # drafts ahead for likely outcomes when a step asks it
    max_tree_nodes: int = 0  # most nodes of a tree step; 0: max_num_speculative_tokens

    def max_nodes(self, max_branch: int) -> int:
        """The most draft tokens it gives a step that may branch this much."""
        if max_branch > 1 and self.max_tree_nodes:
            return self.max_tree_nodes
        return self.max_num_speculative_tokens


def tensor_to_pb(t: torch.Tensor) -> common_pb2.Tensor:
    t = t.detach().to("cpu").contiguous()
    name = str(t.dtype).removeprefix("torch.")
    if t.dtype == torch.bfloat16:
        data = t.view(torch.int16).numpy().astype("<i2").tobytes()
    else:
        data = t.numpy().astype(np.dtype(_NP_DTYPES[name]).newbyteorder("<")).tobytes()
    return common_pb2.Tensor(shape=list(t.shape), dtype=name, data=data)


def tensor_from_pb(msg: common_pb2.Tensor, name: str = "tensor") -> torch.Tensor:
    """The tensor a message carries; InvalidArgument (naming `name`) when its dtype, shape and
    data do not fit together."""
    if msg.dtype not in _TORCH_DTYPES:
        raise InvalidArgument(f"{name}.dtype", f"unsupported tensor dtype {msg.dtype!r}")
    shape = tuple(msg.shape)
    itemsize = _TORCH_DTYPES[msg.dtype].itemsize
    if any(d < 0 for d in shape) or math.prod(shape) * itemsize != len(msg.data):
        raise InvalidArgument(f"{name}.shape", f"{list(shape)} does not fit {len(msg.data)} "
                              f"bytes of {msg.dtype}")
    if msg.dtype == "bfloat16":
        arr = np.frombuffer(msg.data, dtype="<i2").copy()
        return torch.from_numpy(arr).view(torch.bfloat16).reshape(shape)
    arr = np.frombuffer(msg.data, dtype=np.dtype(_NP_DTYPES[msg.dtype]).newbyteorder("<"))
    return torch.from_numpy(arr.astype(_NP_DTYPES[msg.dtype])).reshape(shape)


def step_to_pb(step: SequenceStep) -> pb.SequenceStep:
    msg = pb.SequenceStep(seq_id=step.seq_id, new_tokens=step.new_tokens,
                          full_history=step.full_history, history_len=step.history_len,
                          k=step.k,
                          # a structured output's grammar is the verifier's: not sent every step
                          sampling=sampling_to_pb(dataclasses.replace(step.sampling,
                                                                      structured=None)),
                          draft_ahead=step.draft_ahead,
                          max_branch=step.max_branch if step.max_branch > 1 else 0,
                          ngram_min=step.ngram_min, ngram_max=step.ngram_max)
    if step.hidden_state is not None:
        msg.hidden_state.CopyFrom(tensor_to_pb(step.hidden_state))
    return msg


def step_from_pb(msg: pb.SequenceStep) -> SequenceStep:
    return SequenceStep(
        seq_id=msg.seq_id, new_tokens=list(msg.new_tokens), history_len=msg.history_len,
        k=msg.k, full_history=msg.full_history,
        sampling=sampling_from_pb(msg.sampling, msg.HasField("sampling")),
        hidden_state=(tensor_from_pb(msg.hidden_state, "sequences.hidden_state")
                      if msg.HasField("hidden_state") else None),
        draft_ahead=msg.draft_ahead, max_branch=max(1, msg.max_branch),
        ngram_min=msg.ngram_min, ngram_max=msg.ngram_max)



def checked_steps(steps: list[SequenceStep], d: "ProposerDescription") -> list[SequenceStep]:
    """A message's steps as a proposer may act on them: token ids inside its vocabulary (any
    non-negative id when it has none), valid draft sampling parameters (InvalidArgument
    otherwise), and k no larger than it can draft (asking more is not an error: it drafts
    what it can)."""
    for step in steps:
        bad = [t for t in step.new_tokens if t < 0 or (d.vocab_size and t >= d.vocab_size)]
        if bad:
            raise InvalidArgument("sequences.new_tokens",
                                  f"token id {bad[0]} is outside the vocabulary"
                                  + (f" [0, {d.vocab_size})" if d.vocab_size else ""))
        step.sampling.validate("sequences.sampling.")
        step.k = min(step.k, d.max_nodes(step.max_branch))
    return steps


def draft_to_pb(draft: Draft) -> pb.SequenceDraft:
    msg = pb.SequenceDraft(seq_id=draft.seq_id, tokens=draft.tokens,
                           status=(pb.SEQUENCE_STATUS_RESYNC if draft.resync
                                   else pb.SEQUENCE_STATUS_OK),
                           ahead_outcome=_OUTCOME_TO_PB[draft.ahead_outcome])
    if draft.q is not None:
        for indices, probs in draft.q.rows():
            msg.distributions.add(indices=indices, probs=probs)
    if not draft.is_chain:
        msg.parents.extend(draft.parents)
    return msg


def draft_from_pb(msg: pb.SequenceDraft) -> Draft:
    rows = [(list(d.indices), list(d.probs)) for d in msg.distributions]
    return Draft(seq_id=msg.seq_id, tokens=list(msg.tokens),
                 q=SparseProbs.from_rows(rows) if rows else None,
                 resync=msg.status == pb.SEQUENCE_STATUS_RESYNC,
                 ahead_outcome=_OUTCOME_FROM_PB.get(msg.ahead_outcome, ""),
                 parents=list(msg.parents) if msg.parents else None)


def ahead_to_pb(a: AheadDraft) -> pb.AheadDraft:
    return pb.AheadDraft(seq_id=a.draft.seq_id, history_len=a.history_len, outcome=a.outcome,
                         draft=draft_to_pb(a.draft))


def ahead_from_pb(msg: pb.AheadDraft) -> AheadDraft:
    draft = draft_from_pb(msg.draft)
    draft.seq_id = msg.seq_id
    return AheadDraft(msg.history_len, tuple(msg.outcome), draft)


def description_to_pb(d: ProposerDescription) -> pb.ProposerInfo:
    return pb.ProposerInfo(method=d.method, vocab_size=d.vocab_size,
                           tokenizer_fingerprint=d.tokenizer_fingerprint,
                           max_num_speculative_tokens=d.max_num_speculative_tokens,
                           needs_hidden_state=d.needs_hidden_state, model=d.model,
                           drafts_ahead=d.drafts_ahead, max_tree_nodes=d.max_tree_nodes)


def description_from_pb(msg: pb.ProposerInfo) -> ProposerDescription:
    return ProposerDescription(method=msg.method, vocab_size=msg.vocab_size,
                               tokenizer_fingerprint=msg.tokenizer_fingerprint,
                               max_num_speculative_tokens=msg.max_num_speculative_tokens,
                               needs_hidden_state=msg.needs_hidden_state, model=msg.model,
                               drafts_ahead=msg.drafts_ahead, max_tree_nodes=msg.max_tree_nodes)
