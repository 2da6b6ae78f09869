from protos import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WatchStatsRequest(_message.Message):
    __slots__ = ("interval_ms",)
    INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    interval_ms: int
    def __init__(self, interval_ms: _Optional[int] = ...) -> None: ...

class MethodStats(_message.Message):
    __slots__ = ("method", "proposed_tokens", "accepted_tokens", "steps", "missed_steps", "unavailable", "greedy", "sampled", "round_trips", "longest_draft", "ahead_hits", "ahead_misses", "ahead_pushed", "trees", "round_trips_by_seqs")
    METHOD_FIELD_NUMBER: _ClassVar[int]
    PROPOSED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    MISSED_STEPS_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    GREEDY_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_FIELD_NUMBER: _ClassVar[int]
    ROUND_TRIPS_FIELD_NUMBER: _ClassVar[int]
    LONGEST_DRAFT_FIELD_NUMBER: _ClassVar[int]
    AHEAD_HITS_FIELD_NUMBER: _ClassVar[int]
    AHEAD_MISSES_FIELD_NUMBER: _ClassVar[int]
    AHEAD_PUSHED_FIELD_NUMBER: _ClassVar[int]
    TREES_FIELD_NUMBER: _ClassVar[int]
    ROUND_TRIPS_BY_SEQS_FIELD_NUMBER: _ClassVar[int]
    method: str
    proposed_tokens: int
    accepted_tokens: int
    steps: int
    missed_steps: int
    unavailable: str
    greedy: AcceptanceCounts
    sampled: AcceptanceCounts
    round_trips: _containers.RepeatedCompositeFieldContainer[RoundTripBucket]
    longest_draft: int
    ahead_hits: int
    ahead_misses: int
    ahead_pushed: int
    trees: _containers.RepeatedCompositeFieldContainer[TreeCounts]
    round_trips_by_seqs: _containers.RepeatedCompositeFieldContainer[RoundTripBucket]
    def __init__(self, method: _Optional[str] = ..., proposed_tokens: _Optional[int] = ..., accepted_tokens: _Optional[int] = ..., steps: _Optional[int] = ..., missed_steps: _Optional[int] = ..., unavailable: _Optional[str] = ..., greedy: _Optional[_Union[AcceptanceCounts, _Mapping]] = ..., sampled: _Optional[_Union[AcceptanceCounts, _Mapping]] = ..., round_trips: _Optional[_Iterable[_Union[RoundTripBucket, _Mapping]]] = ..., longest_draft: _Optional[int] = ..., ahead_hits: _Optional[int] = ..., ahead_misses: _Optional[int] = ..., ahead_pushed: _Optional[int] = ..., trees: _Optional[_Iterable[_Union[TreeCounts, _Mapping]]] = ..., round_trips_by_seqs: _Optional[_Iterable[_Union[RoundTripBucket, _Mapping]]] = ...) -> None: ...

class TreeCounts(_message.Message):
    __slots__ = ("branches", "greedy", "sampled")
    BRANCHES_FIELD_NUMBER: _ClassVar[int]
    GREEDY_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_FIELD_NUMBER: _ClassVar[int]
    branches: int
    greedy: AcceptanceCounts
    sampled: AcceptanceCounts
    def __init__(self, branches: _Optional[int] = ..., greedy: _Optional[_Union[AcceptanceCounts, _Mapping]] = ..., sampled: _Optional[_Union[AcceptanceCounts, _Mapping]] = ...) -> None: ...

class RoundTripBucket(_message.Message):
    __slots__ = ("k", "calls", "seconds_total", "max_seqs")
    K_FIELD_NUMBER: _ClassVar[int]
    CALLS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    MAX_SEQS_FIELD_NUMBER: _ClassVar[int]
    k: int
    calls: int
    seconds_total: float
    max_seqs: int
    def __init__(self, k: _Optional[int] = ..., calls: _Optional[int] = ..., seconds_total: _Optional[float] = ..., max_seqs: _Optional[int] = ...) -> None: ...

class AcceptanceCounts(_message.Message):
    __slots__ = ("drafts", "proposed_tokens", "accepted_tokens", "rejections", "asked", "asked_at", "drafted_at", "accepted_at")
    DRAFTS_FIELD_NUMBER: _ClassVar[int]
    PROPOSED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REJECTIONS_FIELD_NUMBER: _ClassVar[int]
    ASKED_FIELD_NUMBER: _ClassVar[int]
    ASKED_AT_FIELD_NUMBER: _ClassVar[int]
    DRAFTED_AT_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_AT_FIELD_NUMBER: _ClassVar[int]
    drafts: int
    proposed_tokens: int
    accepted_tokens: int
    rejections: int
    asked: int
    asked_at: _containers.RepeatedScalarFieldContainer[int]
    drafted_at: _containers.RepeatedScalarFieldContainer[int]
    accepted_at: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, drafts: _Optional[int] = ..., proposed_tokens: _Optional[int] = ..., accepted_tokens: _Optional[int] = ..., rejections: _Optional[int] = ..., asked: _Optional[int] = ..., asked_at: _Optional[_Iterable[int]] = ..., drafted_at: _Optional[_Iterable[int]] = ..., accepted_at: _Optional[_Iterable[int]] = ...) -> None: ...

class StepCostBucket(_message.Message):
    __slots__ = ("max_tokens", "steps", "tokens_total", "seconds_total", "kind", "max_seqs", "method")
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    SECONDS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MAX_SEQS_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    steps: int
    tokens_total: int
    seconds_total: float
    kind: str
    max_seqs: int
    method: str
    def __init__(self, max_tokens: _Optional[int] = ..., steps: _Optional[int] = ..., tokens_total: _Optional[int] = ..., seconds_total: _Optional[float] = ..., kind: _Optional[str] = ..., max_seqs: _Optional[int] = ..., method: _Optional[str] = ...) -> None: ...

class EngineStats(_message.Message):
    __slots__ = ("running", "waiting", "kv_blocks_total", "kv_blocks_free", "steps", "generated_tokens", "finished_requests", "aborted_requests", "preemptions", "step_seconds_total", "methods", "step_cost", "max_num_seqs", "step_cost_by_seqs", "step_cost_by_method")
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_FREE_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    ABORTED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    STEP_SECONDS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    METHODS_FIELD_NUMBER: _ClassVar[int]
    STEP_COST_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_SEQS_FIELD_NUMBER: _ClassVar[int]
    STEP_COST_BY_SEQS_FIELD_NUMBER: _ClassVar[int]
    STEP_COST_BY_METHOD_FIELD_NUMBER: _ClassVar[int]
    running: int
    waiting: int
    kv_blocks_total: int
    kv_blocks_free: int
    steps: int
    generated_tokens: int
    finished_requests: int
    aborted_requests: int
    preemptions: int
    step_seconds_total: float
    methods: _containers.RepeatedCompositeFieldContainer[MethodStats]
    step_cost: _containers.RepeatedCompositeFieldContainer[StepCostBucket]
    max_num_seqs: int
    step_cost_by_seqs: _containers.RepeatedCompositeFieldContainer[StepCostBucket]
    step_cost_by_method: _containers.RepeatedCompositeFieldContainer[StepCostBucket]
    def __init__(self, running: _Optional[int] = ..., waiting: _Optional[int] = ..., kv_blocks_total: _Optional[int] = ..., kv_blocks_free: _Optional[int] = ..., steps: _Optional[int] = ..., generated_tokens: _Optional[int] = ..., finished_requests: _Optional[int] = ..., aborted_requests: _Optional[int] = ..., preemptions: _Optional[int] = ..., step_seconds_total: _Optional[float] = ..., methods: _Optional[_Iterable[_Union[MethodStats, _Mapping]]] = ..., step_cost: _Optional[_Iterable[_Union[StepCostBucket, _Mapping]]] = ..., max_num_seqs: _Optional[int] = ..., step_cost_by_seqs: _Optional[_Iterable[_Union[StepCostBucket, _Mapping]]] = ..., step_cost_by_method: _Optional[_Iterable[_Union[StepCostBucket, _Mapping]]] = ...) -> None: ...

class AbortRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class AbortResponse(_message.Message):
    __slots__ = ("found",)
    FOUND_FIELD_NUMBER: _ClassVar[int]
    found: bool
    def __init__(self, found: _Optional[bool] = ...) -> None: ...

class ProposerStatus(_message.Message):
    __slots__ = ("method", "address", "connected")
    METHOD_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    method: str
    address: str
    connected: bool
    def __init__(self, method: _Optional[str] = ..., address: _Optional[str] = ..., connected: _Optional[bool] = ...) -> None: ...

class VerifierInfo(_message.Message):
    __slots__ = ("model", "vocab_size", "tokenizer_fingerprint", "max_model_len", "max_num_speculative_tokens", "default_num_speculative_tokens", "proposers", "device", "dtype", "max_num_branches", "lookahead_default")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_SPECULATIVE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_NUM_SPECULATIVE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROPOSERS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_BRANCHES_FIELD_NUMBER: _ClassVar[int]
    LOOKAHEAD_DEFAULT_FIELD_NUMBER: _ClassVar[int]
    model: str
    vocab_size: int
    tokenizer_fingerprint: str
    max_model_len: int
    max_num_speculative_tokens: int
    default_num_speculative_tokens: int
    proposers: _containers.RepeatedCompositeFieldContainer[ProposerStatus]
    device: str
    dtype: str
    max_num_branches: int
    lookahead_default: _common_pb2.LookaheadConfig
    def __init__(self, model: _Optional[str] = ..., vocab_size: _Optional[int] = ..., tokenizer_fingerprint: _Optional[str] = ..., max_model_len: _Optional[int] = ..., max_num_speculative_tokens: _Optional[int] = ..., default_num_speculative_tokens: _Optional[int] = ..., proposers: _Optional[_Iterable[_Union[ProposerStatus, _Mapping]]] = ..., device: _Optional[str] = ..., dtype: _Optional[str] = ..., max_num_branches: _Optional[int] = ..., lookahead_default: _Optional[_Union[_common_pb2.LookaheadConfig, _Mapping]] = ...) -> None: ...
