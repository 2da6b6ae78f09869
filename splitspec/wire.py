"""Conversion between protobuf messages and the dataclasses in splitspec.params.

Services call these at their edge only; everything behind the edge works on dataclasses.
"""

from __future__ import annotations

from protos import common_pb2 as pb
from splitspec.errors import InvalidArgument
from splitspec.params import (
    LookaheadParams,
    SamplingParams,
    SpeculationMode,
    SpeculationPlan,
    SpeculationRequest,
    StoppingCriteria,
    StructuredKind,
    StructuredOutput,
    logit_bias_items,
)

_MODE_FROM_PB = {
    pb.SPECULATION_MODE_UNSPECIFIED: SpeculationMode.AUTO,
    pb.SPECULATION_MODE_AUTO: SpeculationMode.AUTO,
    pb.SPECULATION_MODE_ON: SpeculationMode.ON,
    pb.SPECULATION_MODE_OFF: SpeculationMode.OFF,
}

FINISH_REASON_NAMES = {
    pb.FINISH_REASON_UNSPECIFIED: None,
    pb.FINISH_REASON_LENGTH: "length",
    pb.FINISH_REASON_STOP: "stop",
    pb.FINISH_REASON_ABORT: "abort",
}
FINISH_REASON_FROM_NAME = {v: k for k, v in FINISH_REASON_NAMES.items() if v}


def sampling_from_pb(msg: pb.SamplingParams, has_field: bool = True) -> SamplingParams:
    """Proto3 cannot tell 0 from unset for scalars: an absent message means the defaults,
    top_p 0 means off, repetition_penalty 0 means off (1). A present message with temperature 0
    means greedy. top_k -1 means off, as in the REST API; the caller validates the rest (a
    negative top_p is an error)."""
    if not has_field:
        return SamplingParams()
    return SamplingParams(
        temperature=msg.temperature,
        top_p=msg.top_p if msg.top_p != 0 else 1.0,
        top_k=0 if msg.top_k == -1 else msg.top_k,
        min_p=msg.min_p,
        seed=msg.seed if msg.HasField("seed") else None,
        presence_penalty=msg.presence_penalty,
        frequency_penalty=msg.frequency_penalty,
        repetition_penalty=msg.repetition_penalty if msg.repetition_penalty != 0 else 1.0,
        logit_bias=logit_bias_items(msg.logit_bias),
        min_tokens=msg.min_tokens,
        bad_words=tuple(msg.bad_words),
        allowed_token_ids=tuple(msg.allowed_token_ids),
        structured=structured_from_pb(msg.structured) if msg.HasField("structured") else None,
    )


def structured_from_pb(msg: pb.StructuredOutput) -> StructuredOutput:
    """A StructuredOutput from its message (InvalidArgument when no kind is set);
    StructuredOutput.validate checks the rest."""
    kind = msg.WhichOneof("kind")
    if kind is None:
        raise InvalidArgument("structured_outputs", "names no kind (json_object, json_schema, "
                              "regex, choice or grammar)")
    if kind == "choice":
        return StructuredOutput(StructuredKind.CHOICE, choices=tuple(msg.choice.choices))
    if kind == "json_object":
        return StructuredOutput(StructuredKind.JSON_OBJECT)
    return StructuredOutput(StructuredKind(kind), spec=getattr(msg, kind))


def structured_to_pb(s: StructuredOutput) -> pb.StructuredOutput:
    msg = pb.StructuredOutput()
    if s.kind is StructuredKind.CHOICE:
        msg.choice.choices.extend(s.choices)
    elif s.kind is StructuredKind.JSON_OBJECT:
        msg.json_object = True
    else:
        setattr(msg, s.kind.value, s.spec)
    return msg


def sampling_to_pb(params: SamplingParams) -> pb.SamplingParams:
    """The message sampling_from_pb reads back as `params`; repetition_penalty off is written
    as proto3's unset 0, so a message a client sent without it round-trips unchanged."""
    off = params.repetition_penalty == 1.0
    msg = pb.SamplingParams(temperature=params.temperature, top_p=params.top_p,
                            top_k=params.top_k, min_p=params.min_p,
                            presence_penalty=params.presence_penalty,
                            frequency_penalty=params.frequency_penalty,
                            repetition_penalty=0.0 if off else params.repetition_penalty,
                            logit_bias=dict(params.logit_bias), min_tokens=params.min_tokens,
                            bad_words=list(params.bad_words),
                            allowed_token_ids=list(params.allowed_token_ids))
    if params.seed is not None:
        msg.seed = params.seed
    if params.structured is not None:
        msg.structured.CopyFrom(structured_to_pb(params.structured))
    return msg


def stopping_from_pb(msg: pb.StoppingCriteria, has_field: bool = True) -> StoppingCriteria:
    if not has_field:
        return StoppingCriteria()
    return StoppingCriteria(
        max_tokens=msg.max_tokens if msg.max_tokens else StoppingCriteria.max_tokens,
        stop=tuple(msg.stop),
        stop_token_ids=tuple(msg.stop_token_ids),
        ignore_eos=msg.ignore_eos,
    )


def stopping_to_pb(stopping: StoppingCriteria) -> pb.StoppingCriteria:
    return pb.StoppingCriteria(max_tokens=stopping.max_tokens, stop=list(stopping.stop),
                               stop_token_ids=list(stopping.stop_token_ids),
                               ignore_eos=stopping.ignore_eos)


def speculation_from_pb(msg: pb.SpeculationConfig) -> SpeculationRequest:
    """The client's request, read as is; SpeculationRequest.validate checks it."""
    if msg.mode not in _MODE_FROM_PB:  # proto3 keeps enum numbers it does not know
        raise InvalidArgument("speculation.mode", f"unknown value {msg.mode}")
    return SpeculationRequest(
        mode=_MODE_FROM_PB[msg.mode],
        method=msg.method or None,
        num_speculative_tokens=(msg.num_speculative_tokens
                                if msg.HasField("num_speculative_tokens") else None),
        details=msg.details,
        num_branches=msg.num_branches if msg.HasField("num_branches") else None,
        lookahead=(lookahead_from_pb(msg.lookahead) if msg.HasField("lookahead") else None),
        prompt_lookup_min=(msg.prompt_lookup_min if msg.HasField("prompt_lookup_min")
                           else None),
        prompt_lookup_max=(msg.prompt_lookup_max if msg.HasField("prompt_lookup_max")
                           else None),
    )


def lookahead_to_pb(params: LookaheadParams) -> pb.LookaheadConfig:
    msg = pb.LookaheadConfig()
    for name in ("window", "ngram", "guesses"):
        if getattr(params, name) is not None:
            setattr(msg, name, getattr(params, name))
    return msg


def lookahead_from_pb(msg: pb.LookaheadConfig) -> LookaheadParams:
    return LookaheadParams(*(getattr(msg, name) if msg.HasField(name) else None
                             for name in ("window", "ngram", "guesses")))


# The plan crosses from the gateway to the verifier in exactly this pair.

def plan_to_pb(plan: SpeculationPlan) -> pb.SpeculationPlan:
    if not plan.enabled:
        return pb.SpeculationPlan(details=plan.details)
    msg = pb.SpeculationPlan(method=plan.method, k=plan.k, adaptive=plan.adaptive,
                             k_min=plan.k_min, details=plan.details,
                             num_branches=plan.num_branches if plan.num_branches > 1 else 0,
                             prompt_lookup_min=plan.prompt_lookup_min,
                             prompt_lookup_max=plan.prompt_lookup_max)
    if plan.lookahead is not None:
        msg.lookahead.CopyFrom(lookahead_to_pb(plan.lookahead))
    return msg


def plan_from_pb(msg: pb.SpeculationPlan) -> SpeculationPlan:
    """Its shape is trusted (the gateway built it); Engine.add_request checks it against the
    verifier's own limits."""
    if not msg.method or not msg.k:
        return SpeculationPlan(details=msg.details)
    return SpeculationPlan(method=msg.method, k=msg.k, adaptive=msg.adaptive, k_min=msg.k_min,
                           details=msg.details, num_branches=max(1, msg.num_branches),
                           lookahead=(lookahead_from_pb(msg.lookahead)
                                      if msg.HasField("lookahead") else None),
                           prompt_lookup_min=msg.prompt_lookup_min,
                           prompt_lookup_max=msg.prompt_lookup_max)
