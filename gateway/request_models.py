"""The REST request bodies of /v1/completions and /v1/chat/completions, each declared once
(pydantic) as vLLM declares its own: what a body may hold and in which range; from that one
declaration come the validation, the 400 of a body outside it (its `param` the field's path:
`logit_bias`, `speculation.lookahead.window`, `messages[0].content`), the request schemas of
/openapi.json (gateway/openapi.py) and the conversion to the dataclasses the gateway works on
(splitspec.params). The limits are splitspec/params.py's constants, which the verifier's own
checks of the same fields read too.

Types are strict: "5" is not a number, true and 5.0 are not integers, and every optional field
may be null (its default). An unknown field is a 400 naming it; a field served only at its
neutral value (best_of 1, echo false, suffix null) is declared with that value alone. A field
of several shapes (prompt, stop, a message's content) reports one error, at the field. Errors
inside a list of objects name the item (`messages[0]`); inside any other value, the field."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    WrapValidator,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from gateway.chat import CHAT_ROLES, Chat, ChatRequest, ToolTurn
from gateway.openai_api import MAX_N, CompletionRequest, Generation, Prompt
from gateway.tools import Function, ToolUse
from splitspec.errors import InvalidArgument
from splitspec.methods import HYBRID, method_names
from splitspec.params import (
    LOOKAHEAD_RANGES,
    MAX_ALLOWED_TOKEN_IDS,
    MAX_BAD_WORD_CHARS,
    MAX_BAD_WORDS,
    MAX_CACHE_SALT_CHARS,
    MAX_INT32,
    MAX_LOGIT_BIAS,
    MAX_LOGIT_BIAS_ENTRIES,
    MAX_PENALTY,
    MAX_PROMPT_LOOKUP_N,
    MAX_REPETITION_PENALTY,
    MAX_SEED,
    MAX_STOP_STRINGS,
    MAX_STRUCTURED_CHOICES,
    MAX_TOP_LOGPROBS,
    MIN_REPETITION_PENALTY,
    LookaheadParams,
    SamplingParams,
    SpeculationMode,
    SpeculationRequest,
    StoppingCriteria,
    StructuredKind,
    StructuredOutput,
    check_min_tokens,
    check_prompt_lookup,
    logit_bias_items,
)

DEFAULT_MAX_PROMPTS = 16  # prompts per completions request, unless the gateway says (--max-prompts)


def _one_error(reason: str) -> WrapValidator:
    """One error at the field, with this reason, however its value failed (a union would
    report one per alternative)."""
    def validate(value, handler):
        try:
            return handler(value)
        except ValidationError:
            raise PydanticCustomError("invalid", reason) from None

    return WrapValidator(validate)


def _token_id_key(key, handler):
    """logit_bias's keys: token ids as JSON object keys are strings of digits."""
    try:
        key = handler(key)
    except ValidationError:
        key = None
    if key is None or int(key) > MAX_INT32:
        raise PydanticCustomError("token_id", "is not a token id (an integer in [0, 2**31) "
                                  "written as a string)")
    return key


def _number(default=None, **limits):
    return Field(default, allow_inf_nan=False, **limits)


TokenId = Annotated[int, Field(ge=0, le=MAX_INT32)]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]
Text = Annotated[str, Field(min_length=1)]
PromptField = Annotated[
    Text | Annotated[list[Text], Field(min_length=1)] | TokenIds
    | Annotated[list[TokenIds], Field(min_length=1)],
    _one_error("must be a non-empty string, a list of strings, a list of token ids, or a list "
               "of token-id lists")]
Stop = Annotated[Text | Annotated[list[Text], Field(max_length=MAX_STOP_STRINGS)],
                 _one_error("must be a non-empty string or a list of at most "
                            f"{MAX_STOP_STRINGS} of them")]
TokenIdKey = Annotated[str, Field(pattern=r"^(0|[1-9][0-9]{0,9})$"),
                       WrapValidator(_token_id_key)]
Bias = Annotated[float, Field(ge=-MAX_LOGIT_BIAS, le=MAX_LOGIT_BIAS, allow_inf_nan=False)]
LogitBias = Annotated[dict[TokenIdKey, Bias], Field(
    max_length=MAX_LOGIT_BIAS_ENTRIES, json_schema_extra={"additionalProperties": False})]
BadWord = Annotated[str, Field(min_length=1, max_length=MAX_BAD_WORD_CHARS)]
Role = Literal[CHAT_ROLES]  # type: ignore[valid-type]
# speculation.method: a registered method, or a hybrid of them (checked against the
# deployment by SpeculationRequest.validate)
Method = Annotated[str, WithJsonSchema({
    "type": "string",
    "anyOf": [{"enum": list(method_names())},
              {"pattern": f"^{HYBRID}:[a-z]+([+|][a-z]+)+$"}]})]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, protected_namespaces=())


class Lookahead(_Body):
    """Lookahead decoding's shape (method lookahead); unset fields take the verifier's
    defaults (--lookahead-window, -ngram, -guesses)."""

    window: int | None = Field(None, ge=LOOKAHEAD_RANGES["window"][0],
                               le=LOOKAHEAD_RANGES["window"][1],
                               description="W: Jacobi window width")
    ngram: int | None = Field(None, ge=LOOKAHEAD_RANGES["ngram"][0],
                              le=LOOKAHEAD_RANGES["ngram"][1],
                              description="N: n-gram size (the window holds N - 1 levels)")
    guesses: int | None = Field(None, ge=LOOKAHEAD_RANGES["guesses"][0],
                                le=LOOKAHEAD_RANGES["guesses"][1],
                                description="G: candidate n-grams verified per step")

    def params(self) -> LookaheadParams:
        return LookaheadParams(self.window, self.ngram, self.guesses)


class Speculation(_Body):
    """Extension: speculative decoding for this request. The method, k and branches are
    checked against the deployment by the gateway's policy (SpeculationRequest.validate)."""

    mode: Literal["auto", "on", "off"] | None = Field(
        None, description="auto (default): the gateway's policy decides")
    method: Method | None = Field(
        None, description="which proposer; default: the deployment's first. "
        f"{HYBRID}:<method>+<method>: their drafts merged into one token tree per step (e.g. "
        f"hybrid:suffix+eagle), in priority order; {HYBRID}:<method>|<method>: gated, the "
        "next one drafts only where the one before drafted nothing (e.g. hybrid:suffix|eagle)")
    num_speculative_tokens: int | None = Field(None, ge=0, le=MAX_INT32,
                                               description="k; 0 turns speculation off")
    num_branches: int | None = Field(
        None, ge=1, le=MAX_INT32, description="token trees: children per draft node at most "
        "(1: a chain); num_speculative_tokens is the tree's node budget")
    details: bool | None = Field(
        None, description="report acceptance per draft position and per step")
    lookahead: Lookahead | None = None
    prompt_lookup_min: int | None = Field(
        None, ge=1, le=MAX_PROMPT_LOOKUP_N, description="prompt lookup (method ngram, alone or "
        "in a hybrid, or auto's choice): the shortest suffix matched; default: the proposer's "
        "--ngram-min")
    prompt_lookup_max: int | None = Field(
        None, ge=1, le=MAX_PROMPT_LOOKUP_N, description="prompt lookup: the longest suffix "
        "matched, >= prompt_lookup_min; default: the proposer's --ngram-max")

    @model_validator(mode="after")
    def _prompt_lookup(self):
        # the range's order and its method, while parsing (the policy checks it again against
        # the deployment: whether it serves ngram)
        check_prompt_lookup(self.prompt_lookup_min, self.prompt_lookup_max, self.method)
        return self

    def request(self) -> SpeculationRequest:
        return SpeculationRequest(
            mode=SpeculationMode(self.mode or "auto"), method=self.method,
            num_speculative_tokens=self.num_speculative_tokens, details=bool(self.details),
            num_branches=self.num_branches,
            lookahead=self.lookahead.params() if self.lookahead is not None else None,
            prompt_lookup_min=self.prompt_lookup_min, prompt_lookup_max=self.prompt_lookup_max)


JsonSchemaValue = Annotated[dict[str, Any] | bool,
                            _one_error("must be a JSON schema (an object or a boolean)")]


class JsonSchemaFormat(_Body):
    """OpenAI's response_format.json_schema: the schema the output is held to, whatever
    `strict` says (a grammar enforces it either way)."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$",
                      description="the schema's name (letters, digits, _ and -)")
    schema_: JsonSchemaValue = Field(alias="schema", description="a JSON Schema")
    strict: bool | None = Field(None, description="accepted; the schema is always enforced")
    description: str | None = Field(None, description="accepted and ignored")


class ResponseFormat(_Body):
    """OpenAI's response_format: text (free), json_object (any JSON object) or json_schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = Field(None, description="with type json_schema")

    @model_validator(mode="after")
    def _schema_with_its_type(self):
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise InvalidArgument("response_format.json_schema",
                                  "is required with type json_schema, and only with it")
        return self

    def structured(self) -> StructuredOutput | None:
        if self.type == "json_object":
            return StructuredOutput(StructuredKind.JSON_OBJECT)
        if self.type == "json_schema":
            return StructuredOutput(StructuredKind.JSON_SCHEMA,
                                    _schema_text(self.json_schema.schema_))
        return None


class StructuredOutputs(_Body):
    """Extension (vLLM's structured_outputs, its StructuredOutputsParams): exactly one of
    json, regex, choice, grammar, json_object."""

    json_: JsonSchemaValue | str | None = Field(
        None, alias="json", description="a JSON Schema (an object, or its JSON text)")
    regex: str | None = Field(None, min_length=1, description="a regular expression the "
                              "whole output matches")
    choice: list[Text] | None = Field(None, min_length=1, max_length=MAX_STRUCTURED_CHOICES,
                                      description="the output is exactly one of these")
    grammar: str | None = Field(None, min_length=1, description="an EBNF (GBNF) grammar; its "
                                "start rule is `root`")
    json_object: bool | None = Field(None, description="true: any JSON object")

    @model_validator(mode="after")
    def _exactly_one(self):
        given = [n for n, v in (("json", self.json_), ("regex", self.regex),
                                ("choice", self.choice), ("grammar", self.grammar),
                                ("json_object", self.json_object or None)) if v is not None]
        if len(given) != 1:
            raise InvalidArgument("structured_outputs", "must set exactly one of json, regex, "
                                  "choice, grammar, json_object (set: "
                                  f"{', '.join(given) or 'none'})")
        return self

    def structured(self) -> StructuredOutput:
        if self.json_ is not None:
            return StructuredOutput(StructuredKind.JSON_SCHEMA, self.json_ if isinstance(
                self.json_, str) else _schema_text(self.json_),
                public_field="structured_outputs.json")
        if self.regex is not None:
            return StructuredOutput(StructuredKind.REGEX, self.regex)
        if self.choice is not None:
            return StructuredOutput(StructuredKind.CHOICE, choices=tuple(self.choice))
        if self.grammar is not None:
            return StructuredOutput(StructuredKind.GRAMMAR, self.grammar)
        return StructuredOutput(StructuredKind.JSON_OBJECT)


def _schema_text(schema) -> str:
    return json.dumps(schema, ensure_ascii=False, separators=(",", ":"))


class StreamOptions(_Body):
    include_usage: bool | None = Field(None,
                                       description="a last chunk with the request's usage")


class GenerationBody(_Body):
    """The fields every generation request has, chat or completions."""

    model: str | None = Field(None, description="must be the served model when given")
    max_tokens: int | None = Field(None, ge=1, le=MAX_INT32, description="default 16")
    temperature: float | None = _number(ge=0, description="default 1; 0: greedy")
    top_p: float | None = _number(gt=0, le=1, description="default 1 (off)")
    top_k: int | None = Field(None, ge=-1, le=MAX_INT32, description="extension; 0 or -1: off")
    min_p: float | None = _number(ge=0, le=1, description="extension; 0: off")
    seed: int | None = Field(None, ge=0, le=MAX_SEED,
                             description="choice i of n draws with seed + i")
    presence_penalty: float | None = _number(
        ge=-MAX_PENALTY, le=MAX_PENALTY, description="subtracted from the logit of every token "
        "the output holds; 0: off")
    frequency_penalty: float | None = _number(
        ge=-MAX_PENALTY, le=MAX_PENALTY, description="subtracted from a token's logit once per "
        "time the output holds it; 0: off")
    repetition_penalty: float | None = _number(
        ge=MIN_REPETITION_PENALTY, le=MAX_REPETITION_PENALTY, description="extension: the "
        "logit of every token of the prompt or output divided by it (multiplied where "
        "negative); 1: off")
    logit_bias: LogitBias | None = Field(
        None, description="token id (as a string) -> bias added to its logit")
    min_tokens: int | None = Field(
        None, ge=0, le=MAX_INT32, description="extension: EOS and stop_token_ids cannot end "
        "the output before this many tokens; at most max_tokens")
    bad_words: list[BadWord] | None = Field(
        None, max_length=MAX_BAD_WORDS, description="extension: words never generated")
    allowed_token_ids: list[TokenId] | None = Field(
        None, max_length=MAX_ALLOWED_TOKEN_IDS,
        description="extension: only these tokens are generated; empty: every token")
    stop: Stop | None = Field(None, description="stop strings; the match is not returned")
    stop_token_ids: list[TokenId] | None = Field(None, description="extension")
    ignore_eos: bool | None = Field(None, description="extension")
    n: int | None = Field(None, ge=1, le=MAX_N, description="choices per prompt")
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    speculation: Speculation | None = None
    response_format: ResponseFormat | None = Field(
        None, description="OpenAI's: the output as JSON (json_object), or as JSON valid against "
        "a schema (json_schema); text: free")
    structured_outputs: StructuredOutputs | None = Field(
        None, description="extension (vLLM's): the output held to a regex, a list of choices, "
        "a grammar or a JSON schema; not with a response_format other than text")
    cache_salt: str | None = Field(
        None, max_length=MAX_CACHE_SALT_CHARS, description="prefix-cache isolation: KV blocks "
        "are shared only between requests with the same salt (vLLM's name)")
    user: str | None = Field(None, description="accepted and ignored")

    @model_validator(mode="before")
    @classmethod
    def _unicode(cls, body: Any) -> Any:
        _check_unicode(body)
        return body

    @model_validator(mode="after")
    def _min_tokens(self):
        check_min_tokens(self.sampling(), self.stopping(),
                         max_tokens_field=self.max_tokens_field())
        return self

    @model_validator(mode="after")
    def _structured(self):
        if self.structured_outputs is not None and self.response_format is not None \
                and self.response_format.type != "text":
            raise InvalidArgument("structured_outputs", "give response_format or this, not both")
        structured = self.structured()
        if structured is not None:
            structured.validate()  # the spec's size, its JSON, unsupported schema keywords
        return self

    def structured(self) -> StructuredOutput | None:
        if self.structured_outputs is not None:
            return self.structured_outputs.structured()
        return self.response_format.structured() if self.response_format is not None else None

    def max_tokens_field(self) -> str:
        return "max_tokens"

    def sampling(self) -> SamplingParams:
        given = {"temperature": self.temperature, "top_p": self.top_p, "min_p": self.min_p,
                 "seed": self.seed, "presence_penalty": self.presence_penalty,
                 "frequency_penalty": self.frequency_penalty,
                 "repetition_penalty": self.repetition_penalty, "min_tokens": self.min_tokens,
                 "top_k": None if self.top_k is None else max(self.top_k, 0),  # -1: off
                 "logit_bias": None if self.logit_bias is None
                 else logit_bias_items(self.logit_bias),
                 "bad_words": None if self.bad_words is None else tuple(self.bad_words),
                 "allowed_token_ids": (None if self.allowed_token_ids is None
                                       else tuple(self.allowed_token_ids)),
                 "structured": self.structured()}
        return SamplingParams(**{k: v for k, v in given.items() if v is not None})

    def stopping(self) -> StoppingCriteria:
        stop = self.stop if self.stop is not None else ()
        max_tokens = getattr(self, self.max_tokens_field())
        return StoppingCriteria(
            max_tokens=StoppingCriteria.max_tokens if max_tokens is None else max_tokens,
            stop=(stop,) if isinstance(stop, str) else tuple(stop),
            stop_token_ids=tuple(self.stop_token_ids or ()), ignore_eos=bool(self.ignore_eos))

    def generation(self, top_logprobs: int | None) -> Generation:
        return Generation(
            model=self.model, sampling=self.sampling(), stopping=self.stopping(),
            speculation=(self.speculation.request() if self.speculation is not None
                         else SpeculationRequest()),
            n=self.n or 1, stream=bool(self.stream),
            include_usage=bool(self.stream_options and self.stream_options.include_usage),
            top_logprobs=top_logprobs, cache_salt=self.cache_salt)


class CompletionBody(GenerationBody):
    """POST /v1/completions."""

    prompt: PromptField = Field(description="several prompts give several choices (at most "
                                "--max-prompts)")
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS,
                                 description="log-probabilities with this many alternatives")
    best_of: Annotated[Literal[1], _one_error("is not supported (only 1)")] | None = None
    echo: Annotated[Literal[False], _one_error("is not supported (only false)")] | None = None
    suffix: Annotated[None, _one_error("is not supported")] = None

    @field_validator("prompt")
    @classmethod
    def _prompt_count(cls, prompt, info: ValidationInfo):
        limit = (info.context or {}).get("max_prompts", DEFAULT_MAX_PROMPTS)
        if _prompts_of(prompt) and len(_prompts_of(prompt)) > limit:
            raise InvalidArgument("prompt", f"at most {limit} prompts per request")
        return prompt

    def request(self) -> CompletionRequest:
        return CompletionRequest(_prompts_of(self.prompt), self.generation(self.logprobs))


def _prompts_of(prompt) -> list[Prompt]:
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt[0], int):
        return [list(prompt)]
    return [p if isinstance(p, str) else list(p) for p in prompt]


class TextPart(_Body):
    type: Literal["text"]
    text: str


# -- tools ------------------------------------------------------------------------------------

MAX_TOOLS = 128  # tools per request
FunctionName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_.-]+$")]


def _json_schema(value: dict) -> dict:
    """A tool's parameters must be a JSON schema (checked against the metaschema)."""
    import jsonschema

    try:
        jsonschema.validators.validator_for(value).check_schema(value)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.path)
        raise PydanticCustomError("json_schema", "is not a JSON schema ({where}{reason})", {
            "where": f"at {where}: " if where else "", "reason": exc.message}) from None
    return value


class FunctionDefinition(_Body):
    name: FunctionName = Field(description="a-z, A-Z, 0-9, _ . -; at most 64 characters")
    description: str | None = None
    parameters: Annotated[dict[str, Any], WrapValidator(
        lambda v, handler: _json_schema(handler(v)))] | None = Field(
        None, description="a JSON schema of the arguments (an object); none: no arguments")
    strict: bool | None = Field(None, description="accepted; required and named calls are "
                                "always held to the schema")


class Tool(_Body):
    type: Literal["function"]
    function: FunctionDefinition


class ToolChoiceFunction(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: ToolChoiceFunction


ToolChoice = Annotated[Literal["none", "auto", "required"] | NamedToolChoice, _one_error(
    'must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}')]


class CalledFunction(_Body):
    name: str
    arguments: str = Field(description="the arguments, as JSON text")

    @field_validator("arguments")
    @classmethod
    def _json(cls, arguments: str) -> str:
        try:
            json.loads(arguments)
        except ValueError:
            raise PydanticCustomError("json", "must be JSON text") from None
        return arguments


class ToolCall(_Body):
    id: str
    type: Literal["function"]
    function: CalledFunction


class Message(_Body):
    role: Role
    content: Annotated[str | list[TextPart],
                       _one_error("must be a string or a list of text parts")] | None = Field(
        None, description="null only in an assistant message with tool_calls")
    name: str | None = Field(None, description="a tool message: the tool's name; else ignored")
    tool_calls: list[ToolCall] | None = Field(None, description="an assistant message's calls")
    tool_call_id: str | None = Field(None, description="a tool message: the call it answers")

    @field_validator("tool_calls")
    @classmethod
    def _assistant_calls(cls, calls, info: ValidationInfo):
        if calls is not None and info.data.get("role") != "assistant":
            raise PydanticCustomError("tool_calls", "only an assistant message has tool_calls")
        return calls

    @model_validator(mode="after")
    def _content(self):
        if self.content is None and not self.tool_calls:
            raise PydanticCustomError("content", "content is required (null only in an "
                                      "assistant message with tool_calls)")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(
            p.text for p in self.content)

    def tool_turn(self) -> ToolTurn:
        return ToolTurn(tuple((c.id, c.function.name, c.function.arguments)
                              for c in self.tool_calls or ()),
                        self.tool_call_id or "", self.name or "" if self.role == "tool" else "")


class ChatBody(GenerationBody):
    """POST /v1/chat/completions."""

    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_INT32,
                                              description="alias of max_tokens")
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS,
                                     description="needs logprobs: true")
    tools: list[Tool] | None = Field(None, min_length=1, max_length=MAX_TOOLS,
                                     description="functions the model may call")
    tool_choice: ToolChoice | None = Field(
        None, description="none | auto (default with tools) | required | a named function")
    parallel_tool_calls: bool | None = Field(
        None, description="false: at most one call (required); default true")

    @model_validator(mode="after")
    def _aliases(self):
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise InvalidArgument("max_completion_tokens", "give max_tokens or this, not both")
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidArgument("top_logprobs", "needs logprobs: true")
        return self

    @model_validator(mode="after")
    def _tools(self):
        names = [t.function.name for t in self.tools or ()]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise InvalidArgument(f"tools[{i}].function.name", f"{name!r} is named twice")
        if self.tool_choice not in (None, "none") and not names:
            raise InvalidArgument("tool_choice", "needs tools")
        if isinstance(self.tool_choice, NamedToolChoice) and \
                self.tool_choice.function.name not in names:
            raise InvalidArgument("tool_choice.function.name",
                                  f"{self.tool_choice.function.name!r} is not one of the tools")
        return self

    def tool_use(self) -> ToolUse | None:
        if not self.tools:
            return None
        choice = self.tool_choice or "auto"
        named = isinstance(choice, NamedToolChoice)
        return ToolUse("named" if named else choice,
                       tuple(Function(t.function.name, t.function.parameters)
                             for t in self.tools),
                       choice.function.name if named else None,
                       self.parallel_tool_calls is not False)

    def max_tokens_field(self) -> str:
        return ("max_completion_tokens" if self.max_completion_tokens is not None
                else "max_tokens")

    def request(self) -> ChatRequest:
        turns = tuple((m.role, m.text()) for m in self.messages)
        tool_turns = tuple(m.tool_turn() for m in self.messages)
        chat = Chat(turns, tuple(json.dumps(t.model_dump(exclude_none=True))
                                 for t in self.tools or ()),
                    tool_turns if any(t != ToolTurn() for t in tool_turns) else ())
        gen = self.generation((self.top_logprobs or 0) if self.logprobs else None)
        tools = self.tool_use()
        if tools is not None:
            gen = dataclasses.replace(gen, tools=tools)
            structured = tools.structured()
            if structured is not None:
                if gen.sampling.structured is not None:
                    raise InvalidArgument("tool_choice", f"{tools.choice} cannot be combined "
                                          "with a structured output")
                try:
                    structured.validate()
                except InvalidArgument as exc:
                    raise InvalidArgument("tools", exc.message.split(": ", 1)[-1]) from None
                gen = dataclasses.replace(gen, sampling=dataclasses.replace(
                    gen.sampling, structured=structured))
        return ChatRequest(chat, gen)


def parse_completion_request(body: Any, max_prompts: int = DEFAULT_MAX_PROMPTS
                             ) -> CompletionRequest:
    return _validate(CompletionBody, body, max_prompts=max_prompts).request()


def parse_chat_request(body: Any) -> ChatRequest:
    return _validate(ChatBody, body).request()


def _validate(model: type[_Body], body: Any, **context) -> Any:
    try:
        return model.model_validate(body, context=context)
    except ValidationError as exc:
        raise _invalid(model, exc) from None


# -- errors ----------------------------------------------------------------------------------

def _invalid(model: type[_Body], exc: ValidationError) -> InvalidArgument:
    """The first error (an unknown field before any other) as InvalidArgument naming its
    field."""
    errors = exc.errors(include_url=False)
    unknown = sorted((e for e in errors if e["type"] == "extra_forbidden"),
                     key=lambda e: [str(k) for k in e["loc"]])
    error = (unknown or errors)[0]
    loc = error["loc"]
    if error["type"] == "extra_forbidden" and loc[-1] == "":
        return InvalidArgument(_param(model, loc[:-1])[0] or "body",
                               "has a field with an empty name")
    param, rest = _param(model, loc)
    if not param:
        return InvalidArgument("body", "must be a JSON object")
    reason = _reason(error)
    where = _where(rest)
    return InvalidArgument(param, f"{where} {reason}" if where else reason)


def _param(model: type[BaseModel], loc: tuple) -> tuple[str, tuple]:
    """A location as the public field's path, and what lies inside that field. The path goes
    down through objects and lists of objects; it ends at any other field, or at an unknown
    one."""
    path, cls, listed = "", model, False
    for i, key in enumerate(loc):
        if listed and isinstance(key, int):  # an item of a list of objects
            path, listed = f"{path}[{key}]", False
            continue
        if cls is None or not isinstance(key, str):
            return path, loc[i:]
        path = f"{path}.{key}" if path else key
        field = cls.model_fields.get(key)
        if field is None:  # an unknown field
            return path, loc[i + 1:]
        cls, listed = _object_type(field.annotation)
    return path, ()


def _object_type(annotation) -> tuple[type[BaseModel] | None, bool]:
    """(the model, whether a list of it) of an object field's type; (None, False) else."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _object_type(args[0]) if len(args) == 1 else (None, False)
    if typing.get_origin(annotation) is list:
        (item,) = typing.get_args(annotation)
        cls, _ = _object_type(item)
        return cls, cls is not None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    return None, False


def _where(rest: tuple) -> str:
    """Where inside a field's value an error is: `item 2`, `key 'x'`, `entry '5'`."""
    parts = []
    for i, key in enumerate(rest):
        if key == "[key]":
            continue
        if isinstance(key, int):
            parts.append(f"item {key}")
        elif i + 1 < len(rest) and rest[i + 1] == "[key]":
            parts.append(f"key {key!r}")
        else:
            parts.append(f"entry {key!r}")
    return ", ".join(parts)


_REASONS = {
    "missing": "is required",
    "extra_forbidden": "is not a supported field",
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "bool_type": "must be a boolean",
    "string_type": "must be a string",
    "list_type": "must be a list",
    "dict_type": "must be an object",
    "model_type": "must be an object",
    "model_attributes_type": "must be an object",
    "finite_number": "must be a finite number",
    "none_required": "must be null",
}


def _reason(error: dict) -> str:
    kind, ctx = error["type"], error.get("ctx") or {}
    if kind in _REASONS:
        return _REASONS[kind]
    for bound, op in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
        if bound in ctx and kind.startswith(("greater", "less")):
            return f"must be {op} {ctx[bound]:g}" if isinstance(ctx[bound], float) \
                else f"must be {op} {ctx[bound]}"
    if kind == "string_too_short":
        return "must not be empty" if ctx["min_length"] == 1 else \
            f"must have at least {ctx['min_length']} characters"
    if kind == "string_too_long":
        return f"must have at most {ctx['max_length']} characters"
    if kind == "too_short":
        return f"must have at least {ctx['min_length']} items"
    if kind == "too_long":
        return f"must have at most {ctx['max_length']} items"
    if kind == "literal_error":
        return f"must be {ctx['expected']}"
    msg = error["msg"]
    return msg[:1].lower() + msg[1:]


# -- text ------------------------------------------------------------------------------------

def _check_unicode(body: Any) -> None:
    """JSON may escape a lone surrogate ("\\ud800"), which no text encoding (nor protobuf)
    takes: a 400 naming the top-level field that holds one, before anything reads it."""
    todo = [(k, v) for k, v in body.items()] if isinstance(body, dict) else [("body", body)]
    if not all(_utf8(k) for k, _ in todo):
        raise InvalidArgument("body", "field names must be valid Unicode (no lone surrogates)")
    while todo:
        field, value = todo.pop()
        if isinstance(value, str) and not _utf8(value):
            raise InvalidArgument(field, "must be valid Unicode (no lone surrogates)")
        if isinstance(value, dict):
            todo += [(field, k) for k in value] + [(field, v) for v in value.values()]
        elif isinstance(value, list):
            todo += [(field, v) for v in value]


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
