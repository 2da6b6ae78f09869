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
    """A head's config.json names the target's vocabulary and reads features of its width
    (verifier_service/methods/eagle/checkpoint.py checks the rest when it loads)."""
    try:
        tcfg = json.loads((target / "config.json").read_text())
        hcfg = json.loads((model / "config.json").read_text())
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
               Capabilities(), default_port=50052),
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
               Capabilities(cross_request=True), default_port=50055),
    MethodSpec("lookahead", "lookahead decoding: a Jacobi window and an n-gram pool inside the "
               "target's own forward, no draft model",
               "verifier_service.methods.lookahead:LookaheadMethod",
               Capabilities(always_trees=True), kind=Kind.IN_TARGET),
    MethodSpec("eagle", "EAGLE heads on the target's own features, inside the verifier: chains "
               "and EAGLE-2 dynamic trees", "verifier_service.methods.eagle.method:EagleMethod",
               Capabilities(sampled_drafts=True, needs_model=True, token_trees=True),
               model_dir="eagle", fits=_eagle_fits, kind=Kind.IN_TARGET),
)}


def method_names() -> tuple[str, ...]:
    return tuple(METHODS)


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
    trees = spec is not None and spec.capabilities.always_trees
    return step_kind(greedy, max(branches, 2) if trees else branches)
