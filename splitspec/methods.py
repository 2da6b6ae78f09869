"""The registry of speculation methods: every method's name, kind, implementation and declared
capabilities.

Everything that needs to know which methods exist reads this table: request validation
(splitspec/params.py), the proposer service's --method choices and loader
(proposer_service/server.py), the local launcher (which proposers `splitspec up` starts, on which
ports, with which model), the verifier (which in-target methods it serves) and the docs. The
verifier's engine never branches on a method's name: it asks the capabilities a proposer declares
(Proposer/Info: vocabulary, hidden-state needs) or the in-target interface.

Two kinds:
  * `proposer`: drafts come from a proposer process the verifier streams to. Adding one = its own
    file in proposer_service/ (a `Proposer` with `from_config`) plus one entry below.
  * `in_target`: candidates produced inside the verifier, from the target's own step (lookahead
    decoding, heads on the target): no process, no port. Adding one = its own file in
    verifier_service/ (a `verifier_service.methods.in_target.InTargetMethod`) plus one entry below.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from splitspec import speculators_format
from splitspec.goodput import step_kind


class HiddenState(str, enum.Enum):
    NONE = "none"
    # The target's final-norm hidden state at the position that produced the sequence's last
    # token (the verifier sends it with every step message).
    FINAL = "final"


class Kind(str, enum.Enum):
    PROPOSER = "proposer"  # a proposer process (proposer_service/), started by the launcher
    IN_TARGET = "in_target"  # in the verifier (verifier_service/methods/in_target.py): no process


@dataclass(frozen=True)
class Capabilities:
    hidden_state: HiddenState = HiddenState.NONE
    # Drafts for sampled requests carry the q they were drawn from; False: ids only (one-hot).
    sampled_drafts: bool = False
    drafts_ahead: bool = False  # can draft ahead for likely outcomes while the verifier verifies
    needs_model: bool = False  # loads a model directory (--model)
    # One state across all sequences and verifiers it serves (e.g. an index of past outputs):
    # what a proposer in its own service can offer and an in-process one cannot.
    cross_request: bool = False
    # An in-target method whose drafts branch as a request's num_branches asks (token trees
    # the policy may weigh); proposers always do, lookahead shapes its own.
    token_trees: bool = False
    # Every draft is a token tree of the method's own shape, whatever num_branches says
    # (lookahead's window and guesses): its steps run the tree sampler and are priced as such.
    always_trees: bool = False
    # Drafts are copies of earlier text (the prompt, earlier answers): they pay most where an
    # answer quotes its prompt (summaries, retrieval-augmented answers).
    copies_context: bool = False
    # Drafts only for structured requests (the tokens a request's grammar forces): the policy
    # offers it, alone or in a hybrid, to those alone.
    structured_only: bool = False


@dataclass(frozen=True)
class MethodSpec:
    name: str
    summary: str
    # "module:Class", imported lazily: a proposer_service.base.Proposer for a proposer, a
    # verifier_service.methods.in_target.InTargetMethod for an in-target method
    implementation: str
    capabilities: Capabilities
    default_port: int = 0  # the launcher's port for a proposer (in-target methods have none)
    model_dir: str = ""  # the launcher looks for its model here, next to the target directory
    # Cheap file check that a model found next to the target fits it: (target dir, model dir).
    fits: Callable[[Path, Path], bool] | None = None
    kind: Kind = Kind.PROPOSER


def _same_tokenizer(target: Path, model: Path) -> bool:
    tok = target / "tokenizer.json"
    return ((model / "config.json").is_file() and tok.is_file()
            and (model / "tokenizer.json").is_file()
            and (model / "tokenizer.json").read_bytes() == tok.read_bytes())


def _eagle_fits(target: Path, model: Path) -> bool:
    """A head's config.json (published or speculators format) names the target's vocabulary and
    reads features of its width (verifier_service/methods/eagle/checkpoint.py checks the rest
    when it loads)."""
    try:
        tcfg = json.loads((target / "config.json").read_text())
        hcfg = json.loads((model / "config.json").read_text())
        if isinstance(hcfg, dict) and speculators_format.is_speculators(hcfg):
            hcfg = speculators_format.flat_config(hcfg)
    except (OSError, ValueError):
        return False
    width = hcfg.get("target_hidden_size") or hcfg.get("hidden_size")
    return (hcfg.get("vocab_size"), width) == (tcfg.get("vocab_size"), tcfg.get("hidden_size"))


def _speculator_fits(target: Path, model: Path) -> bool:
    try:
        tcfg = json.loads((target / "config.json").read_text())
        scfg = json.loads((model / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return (scfg.get("emb_dim"), scfg.get("vocab_size")) == (tcfg.get("hidden_size"),
                                                              tcfg.get("vocab_size"))


METHODS: dict[str, MethodSpec] = {spec.name: spec for spec in (
    MethodSpec("ngram", "prompt lookup: copies what followed the longest earlier match of the "
               "sequence's suffix", "proposer_service.ngram:NgramProposer",
               Capabilities(copies_context=True), default_port=50052),
    MethodSpec("draft", "a small causal LM with its own KV cache per sequence",
               "proposer_service.draft.proposer:DraftModelProposer",
               Capabilities(sampled_drafts=True, drafts_ahead=True, needs_model=True),
               default_port=50053,
               model_dir="draft", fits=_same_tokenizer),
    MethodSpec("mlp", "an MLP speculator conditioned on the target's last hidden state",
               "proposer_service.mlp.proposer:MlpSpeculatorProposer",
               Capabilities(hidden_state=HiddenState.FINAL, sampled_drafts=True,
                            needs_model=True), default_port=50054,
               model_dir="mlp-speculator", fits=_speculator_fits),
    MethodSpec("suffix", "longest match over this sequence and every earlier request it served, "
               "drafting more when the match is frequent", "proposer_service.suffix:SuffixProposer",
               Capabilities(cross_request=True, copies_context=True), default_port=50055),
    MethodSpec("lookahead", "lookahead decoding: a Jacobi window and an n-gram pool inside the "
               "target's own forward, no draft model",
               "verifier_service.methods.lookahead:LookaheadMethod",
               Capabilities(always_trees=True), kind=Kind.IN_TARGET),
    MethodSpec("eagle", "EAGLE heads on the target's own features, inside the verifier: chains "
               "and EAGLE-2 dynamic trees", "verifier_service.methods.eagle.method:EagleMethod",
               Capabilities(sampled_drafts=True, needs_model=True, token_trees=True),
               model_dir="eagle", fits=_eagle_fits, kind=Kind.IN_TARGET),
    MethodSpec("grammar", "the tokens a structured request's grammar forces next (JSON's keys "
               "and punctuation), tokenized as the model would: structured requests only",
               "verifier_service.methods.grammar:GrammarMethod",
               Capabilities(structured_only=True), kind=Kind.IN_TARGET),
)}


def method_names() -> tuple[str, ...]:
    return tuple(METHODS)


# Hybrid drafts: one step's tree holds several registered methods' candidates at once, merged by
# common prefix within the node budget (kernels/hybrid_merge.py) and verified in one forward. A
# request names it as "hybrid:" and its components joined by "+", in priority order (the first
# is the first child where they differ), e.g. "hybrid:suffix+eagle", "hybrid:ngram+draft".
# Joined by "|" instead, the components are tiers tried in turn, a gated hybrid: a later tier
# drafts only when the earlier ones drafted too little for the step (kernels/hybrid_merge.py
# `tier_suffices`), e.g. "hybrid:suffix|eagle": the suffix tree's chain alone where it matched,
# the EAGLE head's draft where it did not. A tier may itself merge: "hybrid:ngram+suffix|eagle".
HYBRID = "hybrid"
HYBRID_SUMMARY = ("several drafters' candidates in one token tree, merged by common prefix, "
                  "each node verified with its own drafter's q; '|' between them: a later one "
                  "drafts only where the earlier ones drafted nothing")
MAX_HYBRID_COMPONENTS = 3
TIER = "|"  # between a gated hybrid's tiers
MERGE = "+"  # between the components merged within a tier


def hybrid_tiers(method: str | None) -> tuple[tuple[str, ...], ...] | None:
    """A hybrid's tiers, each the components merged within it (unchecked; a plain hybrid is one
    tier), or None when it is not a hybrid."""
    if not method or not method.startswith(HYBRID + ":"):
        return None
    return tuple(tuple(tier.split(MERGE)) for tier in method[len(HYBRID) + 1:].split(TIER))


def hybrid_components(method: str | None) -> tuple[str, ...] | None:
    """The components a hybrid method names, every tier's in order (unchecked), or None when it
    is not a hybrid."""
    tiers = hybrid_tiers(method)
    return None if tiers is None else tuple(p for tier in tiers for p in tier)


def is_gated(method: str | None) -> bool:
    """Whether a hybrid tries its components in tiers ("|"), rather than all every step."""
    tiers = hybrid_tiers(method)
    return tiers is not None and len(tiers) > 1


def hybrid_name(*components: str, gated: bool = False) -> str:
    return f"{HYBRID}:{(TIER if gated else MERGE).join(components)}"


def hybrid_error(method: str) -> str | None:
    """Why `method` is not a hybrid a verifier can run (None: it is). Components: 2 to
    MAX_HYBRID_COMPONENTS distinct registered methods; not lookahead (its window is a tree
    of its own shape), at most one in-target method besides those that draft for structured
    requests only (the grammar's forced tokens keep no state of the model's, so they sit beside
    an EAGLE head: "hybrid:grammar+eagle"; a sequence has a state per in-target method). A
    gated hybrid's tiers before the last are proposers that draft deterministically (n-gram,
    suffix): the gate then depends on the history alone, never on a sampled draw, and the
    later tiers' drafts are asked for after theirs."""
    parts = hybrid_components(method)
    if parts is None:
        return f"{method!r} is not of the form {HYBRID}:<method>+<method>"
    if not 2 <= len(parts) <= MAX_HYBRID_COMPONENTS or len(set(parts)) != len(parts):
        return (f"{method!r}: a hybrid names 2 to {MAX_HYBRID_COMPONENTS} distinct methods "
                f"joined by '{MERGE}' or '{TIER}'")
    unknown = [p for p in parts if p not in METHODS]
    if unknown:
        return f"{method!r}: unknown component {unknown[0]!r}; known: {', '.join(METHODS)}"
    shaped = [p for p in parts if METHODS[p].capabilities.always_trees]
    if shaped:
        return f"{method!r}: {shaped[0]!r} drafts trees of its own shape and cannot join one"
    if sum(METHODS[p].kind is Kind.IN_TARGET and not METHODS[p].capabilities.structured_only
           for p in parts) > 1:
        return f"{method!r}: at most one in-target method besides the grammar's"
    earlier = [p for tier in hybrid_tiers(method)[:-1] for p in tier]
    gating = [p for p in earlier if METHODS[p].kind is not Kind.PROPOSER
              or METHODS[p].capabilities.sampled_drafts]
    if gating:
        return (f"{method!r}: {gating[0]!r} cannot gate a later tier (a tier before '{TIER}' "
                "is a deterministic proposer: " + ", ".join(
                    n for n, s in METHODS.items() if s.kind is Kind.PROPOSER
                    and not s.capabilities.sampled_drafts) + ")")
    return None


def is_method(name: str | None) -> bool:
    """A registered method, or a hybrid of them that a verifier can run."""
    return name in METHODS or (hybrid_components(name) is not None and hybrid_error(name) is None)


def components_of(method: str | None) -> tuple[str, ...]:
    """The registered methods whose drafts a request of `method` uses (itself if not hybrid)."""
    parts = hybrid_components(method)
    return parts if parts is not None else ((method,) if method else ())


def method_served(method: str, served: tuple[str, ...]) -> bool:
    """Whether a deployment serving `served` runs `method` (a hybrid: every component)."""
    return method in served or (is_method(method) and method not in METHODS
                                and all(p in served for p in components_of(method)))


def retrieval_based(method: str | None) -> bool:
    """Whether the method's drafts (or one of a hybrid's) copy from the context rather than
    model it: prompt lookup and suffix decoding, which pay where an answer quotes its prompt."""
    return any(METHODS[p].capabilities.copies_context for p in components_of(method)
               if p in METHODS)


def structured_only(method: str | None) -> bool:
    """Whether a method (or one of a hybrid's components) drafts only for structured requests:
    the policy never offers it to others."""
    return any(METHODS[p].capabilities.structured_only for p in components_of(method)
               if p in METHODS)


def proposer_methods() -> dict[str, MethodSpec]:
    """The methods that run as proposer processes (what a launcher starts)."""
    return {name: spec for name, spec in METHODS.items() if spec.kind is Kind.PROPOSER}


def in_target_methods() -> dict[str, MethodSpec]:
    """The methods that run inside the verifier (no process, no port)."""
    return {name: spec for name, spec in METHODS.items() if spec.kind is Kind.IN_TARGET}


def find_model(spec: MethodSpec, target: str | Path) -> str | None:
    """The method's model directory next to the target, when there is one and it fits: first
    `<target>-<model_dir>` (speculators fitted to that target, e.g.
    models/smollm2-135m-instruct-draft), then `<model_dir>` (the toy family's models/draft)."""
    if not spec.model_dir or spec.fits is None:
        return None
    target = Path(target)
    for found in (target.parent / f"{target.name}-{spec.model_dir}",
                  target.parent / spec.model_dir):
        if found.is_dir() and spec.fits(target, found):
            return str(found)
    return None


def step_kind_of(method: str | None, greedy: bool, branches: int = 1) -> str:
    """The kind of step a request of `method` decodes in (splitspec.goodput.step_kind): a
    method whose drafts are always trees runs tree steps whatever its num_branches says. On a
    GPU a tree step (its sampler run after the captured forward) cost lookahead 3.8-6.4 ms
    against 2.0-2.4 ms for a chain: priced as a chain, auto chose it at 0.38-0.51x off."""
    spec = METHODS.get(method or "")
    # a hybrid's candidates make a tree wherever they differ: priced as one; a gated hybrid
    # of one method per tier verifies one method's draft a step (a chain, unless it branches)
    tiers = hybrid_tiers(method) if spec is None else None
    trees = (spec is not None and spec.capabilities.always_trees) or (
        tiers is not None and any(len(t) > 1 for t in tiers))
    return step_kind(greedy, max(branches, 2) if trees else branches)
