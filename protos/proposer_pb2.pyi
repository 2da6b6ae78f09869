from protos import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SequenceStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SEQUENCE_STATUS_OK: _ClassVar[SequenceStatus]
    SEQUENCE_STATUS_RESYNC: _ClassVar[SequenceStatus]

class AheadOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    AHEAD_NONE: _ClassVar[AheadOutcome]
    AHEAD_HIT: _ClassVar[AheadOutcome]
    AHEAD_MISS: _ClassVar[AheadOutcome]
SEQUENCE_STATUS_OK: SequenceStatus
SEQUENCE_STATUS_RESYNC: SequenceStatus
AHEAD_NONE: AheadOutcome
AHEAD_HIT: AheadOutcome
AHEAD_MISS: AheadOutcome

class SequenceStep(_message.Message):
    __slots__ = ("seq_id", "new_tokens", "full_history", "history_len", "k", "sampling", "hidden_state", "trace_context", "draft_ahead", "max_branch", "ngram_min", "ngram_max")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FULL_HISTORY_FIELD_NUMBER: _ClassVar[int]
    HISTORY_LEN_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_STATE_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    DRAFT_AHEAD_FIELD_NUMBER: _ClassVar[int]
    MAX_BRANCH_FIELD_NUMBER: _ClassVar[int]
    NGRAM_MIN_FIELD_NUMBER: _ClassVar[int]
    NGRAM_MAX_FIELD_NUMBER: _ClassVar[int]
    seq_id: str
    new_tokens: _containers.RepeatedScalarFieldContainer[int]
    full_history: bool
    history_len: int
    k: int
    sampling: _common_pb2.SamplingParams
    hidden_state: _common_pb2.Tensor
    trace_context: _containers.ScalarMap[str, str]
    draft_ahead: bool
    max_branch: int
    ngram_min: int
    ngram_max: int
    def __init__(self, seq_id: _Optional[str] = ..., new_tokens: _Optional[_Iterable[int]] = ..., full_history: _Optional[bool] = ..., history_len: _Optional[int] = ..., k: _Optional[int] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., hidden_state: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., trace_context: _Optional[_Mapping[str, str]] = ..., draft_ahead: _Optional[bool] = ..., max_branch: _Optional[int] = ..., ngram_min: _Optional[int] = ..., ngram_max: _Optional[int] = ...) -> None: ...

class ProposeRequest(_message.Message):
    __slots__ = ("step_id", "sequences", "released", "push_ahead", "outcome_only")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    PUSH_AHEAD_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_ONLY_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    sequences: _containers.RepeatedCompositeFieldContainer[SequenceStep]
    released: _containers.RepeatedScalarFieldContainer[str]
    push_ahead: bool
    outcome_only: bool
    def __init__(self, step_id: _Optional[int] = ..., sequences: _Optional[_Iterable[_Union[SequenceStep, _Mapping]]] = ..., released: _Optional[_Iterable[str]] = ..., push_ahead: _Optional[bool] = ..., outcome_only: _Optional[bool] = ...) -> None: ...

class DraftDistribution(_message.Message):
    __slots__ = ("indices", "probs")
    INDICES_FIELD_NUMBER: _ClassVar[int]
    PROBS_FIELD_NUMBER: _ClassVar[int]
    indices: _containers.RepeatedScalarFieldContainer[int]
    probs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, indices: _Optional[_Iterable[int]] = ..., probs: _Optional[_Iterable[float]] = ...) -> None: ...

class SequenceDraft(_message.Message):
    __slots__ = ("seq_id", "tokens", "distributions", "status", "ahead_outcome", "parents")
    SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    DISTRIBUTIONS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    AHEAD_OUTCOME_FIELD_NUMBER: _ClassVar[int]
    PARENTS_FIELD_NUMBER: _ClassVar[int]
    seq_id: str
    tokens: _containers.RepeatedScalarFieldContainer[int]
    distributions: _containers.RepeatedCompositeFieldContainer[DraftDistribution]
    status: SequenceStatus
    ahead_outcome: AheadOutcome
    parents: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, seq_id: _Optional[str] = ..., tokens: _Optional[_Iterable[int]] = ..., distributions: _Optional[_Iterable[_Union[DraftDistribution, _Mapping]]] = ..., status: _Optional[_Union[SequenceStatus, str]] = ..., ahead_outcome: _Optional[_Union[AheadOutcome, str]] = ..., parents: _Optional[_Iterable[int]] = ...) -> None: ...

class AheadDraft(_message.Message):
    __slots__ = ("seq_id", "history_len", "outcome", "draft")
    SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    HISTORY_LEN_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    DRAFT_FIELD_NUMBER: _ClassVar[int]
    seq_id: str
    history_len: int
    outcome: _containers.RepeatedScalarFieldContainer[int]
    draft: SequenceDraft
    def __init__(self, seq_id: _Optional[str] = ..., history_len: _Optional[int] = ..., outcome: _Optional[_Iterable[int]] = ..., draft: _Optional[_Union[SequenceDraft, _Mapping]] = ...) -> None: ...

class ProposeResponse(_message.Message):
    __slots__ = ("step_id", "drafts", "ahead")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    DRAFTS_FIELD_NUMBER: _ClassVar[int]
    AHEAD_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    drafts: _containers.RepeatedCompositeFieldContainer[SequenceDraft]
    ahead: _containers.RepeatedCompositeFieldContainer[AheadDraft]
    def __init__(self, step_id: _Optional[int] = ..., drafts: _Optional[_Iterable[_Union[SequenceDraft, _Mapping]]] = ..., ahead: _Optional[_Iterable[_Union[AheadDraft, _Mapping]]] = ...) -> None: ...

class ProposerInfo(_message.Message):
    __slots__ = ("method", "vocab_size", "tokenizer_fingerprint", "max_num_speculative_tokens", "needs_hidden_state", "model", "drafts_ahead", "max_tree_nodes")
    METHOD_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_SPECULATIVE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NEEDS_HIDDEN_STATE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DRAFTS_AHEAD_FIELD_NUMBER: _ClassVar[int]
    MAX_TREE_NODES_FIELD_NUMBER: _ClassVar[int]
    method: str
    vocab_size: int
    tokenizer_fingerprint: str
    max_num_speculative_tokens: int
    needs_hidden_state: bool
    model: str
    drafts_ahead: bool
    max_tree_nodes: int
    def __init__(self, method: _Optional[str] = ..., vocab_size: _Optional[int] = ..., tokenizer_fingerprint: _Optional[str] = ..., max_num_speculative_tokens: _Optional[int] = ..., needs_hidden_state: _Optional[bool] = ..., model: _Optional[str] = ..., drafts_ahead: _Optional[bool] = ..., max_tree_nodes: _Optional[int] = ...) -> None: ...
