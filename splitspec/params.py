"""Per-request parameters (sampling, stopping, speculation) as plain validated dataclasses.

Both the gateway (from JSON or protobuf) and the verifier (from protobuf) build these, so the
rules live here once. Every violation raises InvalidArgument naming the public field.

Speculation has two types: `SpeculationRequest` (what a client asked for, validated here) and
`SpeculationPlan` (what the gateway decided and the engine runs; the verifier checks it only
against its own limits, Engine.add_request).
"""

from __future__ import annotations

import enum
import json
import math
from dataclasses import dataclass, field

from splitspec.errors import InvalidArgument
from splitspec.methods import (
    components_of,
    hybrid_components,
    hybrid_error,
    is_method,
    method_names,
    method_served,
)

# Limits every front door enforces alike (the wire types are 32-bit).
MAX_INT32 = 2**31 - 1
MAX_SEED = 2**63 - 1  # a request's seed (the generators take 63 bits)
MAX_STOP_STRINGS = 16
MAX_CACHE_SALT_CHARS = 256  # a request's cache_salt (prefix-cache isolation), as vLLM allows
MAX_TOP_LOGPROBS = 20  # alternatives per token, as OpenAI's API allows
# A prompt text longer than max_model_len * this many characters cannot fit the context (a
# token covers a few characters in practice): rejected before it is tokenized.
MAX_CHARS_PER_TOKEN = 32


class SpeculationMode(str, enum.Enum):
    AUTO = "auto"
    ON = "on"
    OFF = "off"


# Logits processors' limits, as OpenAI's API and vLLM's set them.
MAX_PENALTY = 2.0  # presence_penalty and frequency_penalty in [-2, 2]
# repetition_penalty in [0.01, 10]: it divides positive logits in float32, where a smaller one
# (5e-324 is 0 there) turns them into inf and the row's distribution into NaN
MIN_REPETITION_PENALTY = 0.01
MAX_REPETITION_PENALTY = 10.0
MAX_LOGIT_BIAS = 100.0  # each bias in [-100, 100]
MAX_LOGIT_BIAS_ENTRIES = 300
MAX_BAD_WORDS = 64
MAX_BAD_WORD_CHARS = 256
MAX_ALLOWED_TOKEN_IDS = 1 << 16

# Structured outputs' limits: the spec's text (a schema, a regex, a grammar, the choices
# together) and how many choices.
MAX_STRUCTURED_SPEC_BYTES = 64 * 1024
MAX_STRUCTURED_CHOICES = 1024
# JSON Schema keywords a grammar cannot hold the output to (xgrammar compiles a schema with them
# and ignores them, so the output would not be what the schema says): refused, naming the field.
UNSUPPORTED_SCHEMA_KEYWORDS = ("if", "then", "else", "$dynamicRef", "$dynamicAnchor")
# keywords whose value is a schema, a list of schemas, or an object of schemas (where the
# unsupported keywords are looked for; a property named "if" is not one)
_SUBSCHEMA = ("items", "additionalProperties", "additionalItems", "not", "contains",
              "propertyNames", "unevaluatedProperties", "unevaluatedItems")
_SUBSCHEMAS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions",
                   "dependentSchemas")


class StructuredKind(str, enum.Enum):
    """What a structured output is held to: OpenAI's response_format types and vLLM's
    structured_outputs fields."""

    JSON_OBJECT = "json_object"  # any JSON object
    JSON_SCHEMA = "json_schema"  # a JSON object valid against a schema
    REGEX = "regex"  # text matching a regular expression
    CHOICE = "choice"  # exactly one of a list of strings
    GRAMMAR = "grammar"  # text of an EBNF (GBNF) grammar, its root rule `root`


# The public field each kind comes from (what an InvalidArgument names): OpenAI's
# response_format for JSON, vLLM's structured_outputs for the rest.
STRUCTURED_FIELDS = {
    StructuredKind.JSON_OBJECT: "response_format",
    StructuredKind.JSON_SCHEMA: "response_format.json_schema",
    StructuredKind.REGEX: "structured_outputs.regex",
    StructuredKind.CHOICE: "structured_outputs.choice",
    StructuredKind.GRAMMAR: "structured_outputs.grammar",
}


@dataclass(frozen=True)
class StructuredOutput:
    """A request's output held to a structure: every verified row of the target is masked to
    the tokens the structure allows after that row's prefix, and the request ends ("stop") when
    the structure is complete (verifier_service/grammar/)."""

    kind: StructuredKind
    spec: str = ""  # the schema (JSON text), the regex or the grammar; "" for json_object
    choices: tuple[str, ...] = ()  # kind choice only
    # the public field it came from where it is not the kind's own (a schema given as vLLM's
    # structured_outputs.json); not sent on the wire: the gateway names it in errors
    public_field: str = field(default="", compare=False)

    @property
    def field(self) -> str:
        return self.public_field or STRUCTURED_FIELDS[self.kind]

    @property
    def key(self) -> tuple:
        """What names the compiled grammar (the verifier's compile cache is keyed by it)."""
        return (self.kind.value, self.spec, self.choices)

    def validate(self) -> "StructuredOutput":
        name = self.field
        if not isinstance(self.kind, StructuredKind):
            raise InvalidArgument("structured_outputs", f"unknown kind {self.kind!r}")
        size = len(self.spec.encode()) + sum(len(c.encode()) for c in self.choices)
        if size > MAX_STRUCTURED_SPEC_BYTES:
            raise InvalidArgument(name, f"is {size} bytes; at most {MAX_STRUCTURED_SPEC_BYTES}")
        if self.kind is StructuredKind.CHOICE:
            if not self.choices or len(self.choices) > MAX_STRUCTURED_CHOICES:
                raise InvalidArgument(name, f"must list 1 to {MAX_STRUCTURED_CHOICES} strings")
            if any(not c for c in self.choices):
                raise InvalidArgument(name, "choices must be non-empty strings")
        elif self.choices:
            raise InvalidArgument(name, "takes no choices")
        if self.kind in (StructuredKind.REGEX, StructuredKind.GRAMMAR, StructuredKind.JSON_SCHEMA):
            if not self.spec.strip():
                raise InvalidArgument(name, "must not be empty")
        elif self.spec:
            raise InvalidArgument(name, "takes no spec")
        if self.kind is StructuredKind.JSON_SCHEMA:
            try:
                schema = json.loads(self.spec)
            except ValueError as exc:
                raise InvalidArgument(name, f"is not JSON: {exc}") from None
            if not isinstance(schema, (dict, bool)):
                raise InvalidArgument(name, "must be a JSON object (a schema)")
            unsupported = unsupported_schema_keyword(schema)
            if unsupported is not None:
                raise InvalidArgument(name, f"uses {unsupported}, which structured outputs do "
                                      "not support")
        return self


def unsupported_schema_keyword(schema) -> str | None:
    """The first keyword of a JSON schema that a grammar cannot enforce (`if` at #/properties/a
    is "keyword 'if' at #/properties/a"), a $ref outside the schema included; None: none."""
    todo = [(schema, "#")]
    while todo:
        node, where = todo.pop()
        if not isinstance(node, dict):
            continue
        for key in UNSUPPORTED_SCHEMA_KEYWORDS:
            if key in node:
                return f"keyword {key!r} at {where}"
        ref = node.get("$ref")
        if isinstance(ref, str) and not ref.startswith("#"):
            return f"a $ref outside the schema ({ref[:80]!r}) at {where}"
        for key in _SUBSCHEMA:
            if isinstance(node.get(key), dict):
                todo.append((node[key], f"{where}/{key}"))
        for key in _SUBSCHEMAS:
            if isinstance(node.get(key), list):
                todo += [(sub, f"{where}/{key}/{i}") for i, sub in enumerate(node[key])]
        for key in _SUBSCHEMA_MAPS:
            if isinstance(node.get(key), dict):
                todo += [(sub, f"{where}/{key}/{name}") for name, sub in node[key].items()]
    return None


@dataclass(frozen=True)
class SamplingParams:
    """How the target's distribution is shaped at every row a request samples or verifies.

    Logits processors first, on the raw logits and with the row's own history (the committed
    output plus the drafts before the row; kernels/logits_processors.py): repetition, frequency
    and presence penalties, logit bias, then the masks (allowed_token_ids, bad_words,
    min_tokens, and a structured output's grammar). Then temperature, top-k, top-p and min-p
    (kernels/sampling.py)."""

    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0  # 1: off
    top_k: int = 0  # 0: off
    min_p: float = 0.0  # 0: off
    seed: int | None = None
    presence_penalty: float = 0.0  # 0: off
    frequency_penalty: float = 0.0  # 0: off
    repetition_penalty: float = 1.0  # 1: off
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias), ids ascending
    min_tokens: int = 0  # 0: off
    bad_words: tuple[str, ...] = ()
    allowed_token_ids: tuple[int, ...] = ()  # empty: every token
    structured: StructuredOutput | None = None  # None: free text

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_processors(self) -> bool:
        """Whether a logits processor changes this request's rows (then each verified row is
        processed with its own history before sampling or the argmax)."""
        return bool(self.presence_penalty or self.frequency_penalty
                    or self.repetition_penalty != 1.0 or self.logit_bias or self.min_tokens
                    or self.bad_words or self.allowed_token_ids or self.structured is not None)

    def validate(self, prefix: str = "") -> "SamplingParams":
        _finite(prefix + "temperature", self.temperature)
        if self.temperature < 0:
            raise InvalidArgument(prefix + "temperature", "must be >= 0")
        _finite(prefix + "top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidArgument(prefix + "top_p", "must be in (0, 1]")
        if not 0 <= self.top_k <= MAX_INT32:
            raise InvalidArgument(prefix + "top_k", "must be in [0, 2**31) (0 disables it)")
        _finite(prefix + "min_p", self.min_p)
        if not 0.0 <= self.min_p <= 1.0:
            raise InvalidArgument(prefix + "min_p", "must be in [0, 1]")
        if self.seed is not None and not 0 <= self.seed <= MAX_SEED:
            raise InvalidArgument(prefix + "seed", "must be in [0, 2**63)")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _finite(prefix + name, value)
            if not -MAX_PENALTY <= value <= MAX_PENALTY:
                raise InvalidArgument(prefix + name, f"must be in [-{MAX_PENALTY:g}, "
                                      f"{MAX_PENALTY:g}]")
        _finite(prefix + "repetition_penalty", self.repetition_penalty)
        if not MIN_REPETITION_PENALTY <= self.repetition_penalty <= MAX_REPETITION_PENALTY:
            raise InvalidArgument(prefix + "repetition_penalty",
                                  f"must be in [{MIN_REPETITION_PENALTY:g}, "
                                  f"{MAX_REPETITION_PENALTY:g}] (1: off)")
        if len(self.logit_bias) > MAX_LOGIT_BIAS_ENTRIES:
            raise InvalidArgument(prefix + "logit_bias", f"has {len(self.logit_bias)} entries; "
                                  f"at most {MAX_LOGIT_BIAS_ENTRIES}")
        for token, bias in self.logit_bias:
            if not 0 <= token <= MAX_INT32:
                raise InvalidArgument(prefix + "logit_bias",
                                      f"token id {token} is not in [0, 2**31)")
            if not (math.isfinite(bias) and -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS):
                raise InvalidArgument(prefix + "logit_bias", f"the bias of token {token} must "
                                      f"be in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]")
        if not 0 <= self.min_tokens <= MAX_INT32:
            raise InvalidArgument(prefix + "min_tokens", "must be in [0, 2**31)")
        if len(self.bad_words) > MAX_BAD_WORDS:
            raise InvalidArgument(prefix + "bad_words", f"at most {MAX_BAD_WORDS} words")
        if any(not w or len(w) > MAX_BAD_WORD_CHARS for w in self.bad_words):
            raise InvalidArgument(prefix + "bad_words", "each word must have 1 to "
                                  f"{MAX_BAD_WORD_CHARS} characters")
        if len(self.allowed_token_ids) > MAX_ALLOWED_TOKEN_IDS:
            raise InvalidArgument(prefix + "allowed_token_ids",
                                  f"at most {MAX_ALLOWED_TOKEN_IDS} token ids")
        check_token_ids(prefix + "allowed_token_ids", self.allowed_token_ids)
        if self.structured is not None:
            self.structured.validate()
        return self

    def check_vocab(self, vocab: int, prefix: str = "") -> None:
        """The token ids this request names against a model's vocabulary (what only a server
        that knows the model can check)."""
        for name, ids in (("logit_bias", [t for t, _ in self.logit_bias]),
                          ("allowed_token_ids", self.allowed_token_ids)):
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise InvalidArgument(prefix + name, f"token id {bad[0]} is outside the "
                                      f"vocabulary [0, {vocab})")


def logit_bias_items(mapping) -> tuple[tuple[int, float], ...]:
    """A logit bias map (token id -> bias) as SamplingParams keeps it: ids ascending."""
    return tuple(sorted((int(t), float(b)) for t, b in mapping.items()))


@dataclass(frozen=True)
class StoppingCriteria:
    max_tokens: int = 16
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def validate(self) -> "StoppingCriteria":
        if not 1 <= self.max_tokens <= MAX_INT32:
            raise InvalidArgument("max_tokens", "must be in [1, 2**31)")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidArgument("stop", f"at most {MAX_STOP_STRINGS} stop strings")
        if any(not s for s in self.stop):
            raise InvalidArgument("stop", "stop strings must be non-empty")
        check_token_ids("stop_token_ids", self.stop_token_ids)
        return self


# Lookahead decoding's shape per request (the verifier's --lookahead-* options are the defaults):
# bounded so that one request cannot ask a step of unbounded rows.
MAX_LOOKAHEAD_WINDOW = 16
MAX_LOOKAHEAD_NGRAM = 8
MAX_LOOKAHEAD_GUESSES = 16
LOOKAHEAD = "lookahead"  # the registry's in-target method these parameters shape
# each field's [lo, hi]: a window of at least one guess, n-grams of at least two tokens
LOOKAHEAD_RANGES = {"window": (1, MAX_LOOKAHEAD_WINDOW), "ngram": (2, MAX_LOOKAHEAD_NGRAM),
                    "guesses": (0, MAX_LOOKAHEAD_GUESSES)}


@dataclass(frozen=True)
class LookaheadParams:
    """Lookahead decoding's (W, N, G) as a request asks them: window width, n-gram size, guesses
    verified per step; None takes the verifier's default (--lookahead-window, -ngram,
    -guesses). Only read when the request's method is lookahead."""

    window: int | None = None
    ngram: int | None = None
    guesses: int | None = None

    def validate(self) -> "LookaheadParams":
        for name, (lo, hi) in LOOKAHEAD_RANGES.items():
            value = getattr(self, name)
            if value is not None and not lo <= value <= hi:
                raise InvalidArgument(f"speculation.lookahead.{name}", f"must be in [{lo}, {hi}]")
        return self

    def over(self, default: "LookaheadParams") -> "LookaheadParams":
        """This shape with each unset field taken from `default` (a verifier's own)."""
        return LookaheadParams(*(default_value if value is None else value
                                 for value, default_value in ((self.window, default.window),
                                                              (self.ngram, default.ngram),
                                                              (self.guesses, default.guesses))))


def lookahead_window_nodes(window: int, ngram: int) -> int:
    """Draft nodes of lookahead's Jacobi window: W guesses on each of its N - 1 levels. A step
    feeds the window whole or not at all, so it must fit a verifier's node limit (its largest k)."""
    return window * (ngram - 1)


def lookahead_step_nodes(window: int, ngram: int, guesses: int) -> int:
    """Draft nodes of one whole lookahead step: the window and G pool candidates of N - 1 tokens
    each. Below it a step that feeds the window has no room left for the candidates, which are
    what lookahead accepts (the window only fills the pool): at the window's size alone the
    default shape made 1.05 tokens per step where the whole step made 2.1 (toy target,
    repetitive text)."""
    return lookahead_window_nodes(window, ngram) + guesses * (ngram - 1)


def check_lookahead_fits(shape: LookaheadParams, max_k: int) -> None:
    """InvalidArgument (naming speculation.lookahead.window) when a complete shape's window
    needs more draft nodes than `max_k`, the deployment's --max-num-speculative-tokens."""
    nodes = lookahead_window_nodes(shape.window, shape.ngram)
    if nodes > max_k:
        raise InvalidArgument(
            "speculation.lookahead.window",
            f"the window's W x (N - 1) = {shape.window} x {shape.ngram - 1} = {nodes} nodes "
            f"exceed this deployment's node limit {max_k} (--max-num-speculative-tokens)")


# Prompt lookup's match range per request (vLLM's prompt_lookup_min / prompt_lookup_max): the
# n-gram proposer matches suffixes of min..max tokens for this request instead of its own
# --ngram-min / --ngram-max. Bounded so that one request cannot make every step scan long keys.
MAX_PROMPT_LOOKUP_N = 16
NGRAM = "ngram"  # the registry's method these fields shape (alone or inside a hybrid)


def check_prompt_lookup(lo: int | None, hi: int | None, method: str | None,
                        available_methods: tuple[str, ...] | None = None) -> None:
    """The range's one check: each bound in [1, MAX_PROMPT_LOOKUP_N], min <= max when both are
    given, and a method that drafts by prompt lookup (ngram, or a hybrid with it; None: the
    policy's choice, which then must be able to pick it)."""
    if lo is None and hi is None:
        return
    for name, value in (("prompt_lookup_min", lo), ("prompt_lookup_max", hi)):
        if value is not None and not 1 <= value <= MAX_PROMPT_LOOKUP_N:
            raise InvalidArgument(f"speculation.{name}", f"must be in [1, {MAX_PROMPT_LOOKUP_N}]")
    name = "speculation.prompt_lookup_min" if lo is not None else "speculation.prompt_lookup_max"
    if lo is not None and hi is not None and lo > hi:
        raise InvalidArgument("speculation.prompt_lookup_min",
                              f"({lo}) must be <= speculation.prompt_lookup_max ({hi})")
    if method is not None and NGRAM not in components_of(method):
        raise InvalidArgument(name, f"shapes method {NGRAM!r} (alone or in a hybrid) only, "
                              f"not {method!r}")
    if available_methods is not None and NGRAM not in available_methods:
        raise InvalidArgument(name, f"no {NGRAM!r} proposer is served by this deployment")


def prompt_lookup_range(lo: int, hi: int, default_lo: int, default_hi: int) -> tuple[int, int]:
    """The range an n-gram proposer matches for a step: the request's bounds (0: unset) over its
    own; a bound given alone that crosses the other default moves that default with it."""
    if lo and hi:
        return lo, hi
    if lo:
        return lo, max(lo, default_hi)
    if hi:
        return min(hi, default_lo), hi
    return default_lo, default_hi


@dataclass(frozen=True)
class SpeculationRequest:
    """What the client asked for (the public SpeculationConfig, or REST's `speculation`); the
    gateway's policy turns it into a SpeculationPlan."""

    mode: SpeculationMode = SpeculationMode.AUTO
    method: str | None = None  # None: the deployment's default
    num_speculative_tokens: int | None = None  # None: the deployment's default
    details: bool = False  # per-position and per-step counts in usage.speculation
    num_branches: int | None = None  # children per draft node at most; None: 1 (a chain)
    lookahead: LookaheadParams | None = None  # lookahead's (W, N, G); None: the defaults
    # prompt lookup's match range (n-gram proposer); None: the proposer's --ngram-min/-max
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None

    def validate(self, available_methods: tuple[str, ...] | None = None,
                 max_k: int | None = None, max_branches: int | None = None
                 ) -> "SpeculationRequest":
        """The one check of the public fields; against the deployment when its served methods
        and largest k are given (REST also calls it without them, while parsing)."""
        if self.method is not None:
            if hybrid_components(self.method) is not None:
                if not is_method(self.method):
                    raise InvalidArgument("speculation.method", hybrid_error(self.method))
            elif self.method not in method_names():
                raise InvalidArgument(
                    "speculation.method",
                    f"unknown method {self.method!r}; known: {', '.join(method_names())}, "
                    "or hybrid:<method>+<method> (or <method>|<method>: gated)")
            if available_methods is not None and not method_served(self.method,
                                                                   available_methods):
                served = ", ".join(available_methods) or "none"
                raise InvalidArgument(
                    "speculation.method",
                    f"{self.method!r} is not served by this deployment; served: {served}")
        k = self.num_speculative_tokens
        if k is not None:
            if not 0 <= k <= MAX_INT32:
                raise InvalidArgument("speculation.num_speculative_tokens",
                                      "must be in [0, 2**31)")
            if max_k is not None and k > max_k:
                raise InvalidArgument("speculation.num_speculative_tokens",
                                      f"must be <= {max_k} (this deployment's limit)")
        b = self.num_branches
        if b is not None:
            if not 1 <= b <= MAX_INT32:
                raise InvalidArgument("speculation.num_branches", "must be >= 1 (1: a chain)")
            if max_branches is not None and b > max_branches:
                raise InvalidArgument("speculation.num_branches",
                                      f"must be <= {max_branches} (this deployment's limit)")
        if self.lookahead is not None:
            if self.method not in (None, LOOKAHEAD):
                raise InvalidArgument("speculation.lookahead",
                                      f"shapes method {LOOKAHEAD!r} only, not {self.method!r}")
            self.lookahead.validate()
        check_prompt_lookup(self.prompt_lookup_min, self.prompt_lookup_max, self.method,
                            available_methods)
        if self.mode is SpeculationMode.ON and k != 0 and available_methods == ():
            raise InvalidArgument("speculation.mode", "no proposer is served by this deployment")
        return self


@dataclass(frozen=True)
class SpeculationPlan:
    """The speculation decided for one request, as the engine runs it: which proposer, how many
    draft tokens per step (0: off), and whether k is re-decided every step. The gateway's policy
    builds it; protobuf's SpeculationPlan carries it to the verifier (splitspec/wire.py)."""

    method: str | None = None
    k: int = 0  # with `adaptive`: the first step's k
    # The verifier re-decides k every step (goodput), within [k_min, its limit].
    adaptive: bool = False
    k_min: int = 0
    details: bool = False  # report per-position and per-step counts (not read by the engine)
    # Token trees: each draft node may have up to this many children (1: a chain); k is then
    # the tree's node budget.
    num_branches: int = 1
    lookahead: LookaheadParams | None = None  # with method lookahead: its (W, N, G) as asked
    # with a method that drafts by prompt lookup: its match range (0: the proposer's own)
    prompt_lookup_min: int = 0
    prompt_lookup_max: int = 0

    @property
    def enabled(self) -> bool:
        return self.method is not None and self.k > 0


def plan_prompt_lookup(req: SpeculationRequest, method: str | None) -> dict[str, int]:
    """The plan's prompt-lookup fields for a request run with `method`: the request's range
    where the method drafts by prompt lookup, else none."""
    if method is None or NGRAM not in components_of(method):
        return {}
    return {"prompt_lookup_min": req.prompt_lookup_min or 0,
            "prompt_lookup_max": req.prompt_lookup_max or 0}


@dataclass(frozen=True)
class GenerationInput:
    """A validated request as the verifier's engine sees it."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stopping: StoppingCriteria = field(default_factory=StoppingCriteria)
    speculation: SpeculationPlan = field(default_factory=SpeculationPlan)
    top_logprobs: int | None = None  # set: report logprobs with this many alternatives
    # A request resumed on this replica after another one died mid-stream: the output the
    # client already has (tokens, and characters of text), continued from, never sent again.
    resumed_output_ids: tuple[int, ...] = ()
    resumed_text_chars: int = 0
    # prefix caching: KV blocks are shared only between requests with the same salt
    cache_salt: str | None = None


def check_token_ids(name: str, ids) -> None:
    if any(not 0 <= t <= MAX_INT32 for t in ids):
        raise InvalidArgument(name, "token ids must be in [0, 2**31)")


def check_cache_salt(name: str, salt) -> None:
    """A cache salt is a string of at most MAX_CACHE_SALT_CHARS characters (or absent)."""
    if salt is None:
        return
    if not isinstance(salt, str):
        raise InvalidArgument(name, "must be a string")
    if len(salt) > MAX_CACHE_SALT_CHARS:
        raise InvalidArgument(name, f"is {len(salt)} characters; at most "
                              f"{MAX_CACHE_SALT_CHARS}")


def check_min_tokens(sampling: SamplingParams, stopping: StoppingCriteria,
                     prefix: str = "", max_tokens_field: str = "max_tokens") -> None:
    """min_tokens may not exceed max_tokens (a request could never satisfy both); the message
    names max_tokens by the field the request gave it in."""
    if sampling.min_tokens > stopping.max_tokens:
        raise InvalidArgument(prefix + "min_tokens", f"({sampling.min_tokens}) must be <= "
                              f"{max_tokens_field} ({stopping.max_tokens})")


def check_top_logprobs(name: str, n: int | None) -> None:
    if n is not None and not 0 <= n <= MAX_TOP_LOGPROBS:
        raise InvalidArgument(name, f"must be in [0, {MAX_TOP_LOGPROBS}]")


def check_prompt_chars(name: str, chars: int, max_model_len: int) -> None:
    """Reject a prompt text too long to fit the context, before anything tokenizes it."""
    limit = max_model_len * MAX_CHARS_PER_TOKEN
    if chars > limit:
        raise InvalidArgument(name, f"is {chars} characters; at most {limit} fit this model's "
                              f"context of {max_model_len} tokens")


def _finite(name: str, value: float) -> None:
    if not math.isfinite(value):
        raise InvalidArgument(name, "must be a finite number")


def resolve_speculation(req: SpeculationRequest, available_methods: tuple[str, ...],
                        default_k: int) -> SpeculationPlan:
    """A plan for a request without the gateway's policy (a direct client of the verifier):
    validated, then auto and on take the request's method (else the first served) and its k
    (else `default_k`), fixed for every step; off and k = 0 are off. The verifier's own limit
    on k is the engine's check, as for every plan."""
    req.validate(available_methods)
    k = default_k if req.num_speculative_tokens is None else req.num_speculative_tokens
    if req.mode is SpeculationMode.OFF or not available_methods or k <= 0:
        return SpeculationPlan(details=req.details)
    method = req.method or available_methods[0]
    return SpeculationPlan(method=method, k=k, details=req.details,
                           num_branches=req.num_branches or 1,
                           lookahead=req.lookahead if method == LOOKAHEAD else None,
                           **plan_prompt_lookup(req, method))
