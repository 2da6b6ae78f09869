"""The configurations bench/specbench.py measures, one line each.

A configuration is what a client asks (the request's `speculation`, written as the JSON of the
SpeculationConfig message: field names as in protos/common.proto, `mode` one of "on", "off",
"auto") and which methods its stack serves (proposer processes to start; in-target methods are
served by the verifier, those with a model when the target has one beside it). Each runs in a
stack of its own, started for it. A new kind of request is one more line, e.g.

    Config("hybrid2", "hybrid ngram+draft", {"mode": "on", "method": "hybrid:ngram+draft", ...},
           ("ngram", "draft")),

or, without editing this file, on the command line (`parse_extra`):

    --config 'hybrid={"mode": "on", "method": "hybrid:suffix+eagle"}@suffix,eagle'

k per method: one each, where bench-real measured it best on held-out chat for the drafters
(drafts are rarely accepted past the second or third position there), 4 for the copying methods
(Spec-Bench's summarization and RAG copy long spans), EAGLE also as bench-real's 8-node tree,
lookahead at its default shape as a user asks it (no k: the gateway plans its whole step).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

ALL_METHODS = ("ngram", "suffix", "draft", "mlp", "eagle", "lookahead")


@dataclass(frozen=True)
class Config:
    key: str  # the name --configs selects it by
    label: str  # its row in the report (no "|": a markdown table cell)
    speculation: dict  # the request's SpeculationConfig as JSON (details are always asked)
    methods: tuple[str, ...] = ()  # what its stack serves
    # flags for its stack's proposer processes, by method (e.g. the n-gram's longest match)
    proposer_args: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def args_of(self, method: str) -> list[str]:
        return [a for m, args in self.proposer_args if m == method for a in args]

    @property
    def is_off(self) -> bool:
        return self.speculation.get("mode") == "off"


def on(method: str, k: int | None = None, **extra) -> dict:
    spec = {"mode": "on", "method": method, **extra}
    if k is not None:
        spec["num_speculative_tokens"] = k
    return spec


CONFIGS = [
    Config("off", "off", {"mode": "off"}),
    Config("ngram", "ngram k=4", on("ngram", 4), ("ngram",)),
    Config("suffix", "suffix k=4", on("suffix", 4), ("suffix",)),
    Config("draft", "draft k=3", on("draft", 3), ("draft",)),
    Config("mlp", "mlp k=2", on("mlp", 2), ("mlp",)),
    Config("eagle", "eagle k=3", on("eagle", 3), ("eagle",)),
    Config("eagle-tree", "eagle tree b=4, 8 nodes", on("eagle", 8, num_branches=4), ("eagle",)),
    Config("lookahead", "lookahead W3 N3 G2 (default)", on("lookahead"), ("lookahead",)),
    # Spec-Bench's prompt lookup (evaluation/inference_pld.py): matches of 3 tokens at most
    # (draft_matching_window_size), 10 draft tokens (draft_num_candidate_tokens)
    Config("pld", "ngram at PLD's shape (n <= 3, k=10)", on("ngram", 10), ("ngram",),
           (("ngram", ("--ngram-max", "3")),)),
    # retrieval and the in-target head verified together: a tree of up to 6 nodes
    Config("hybrid", "hybrid suffix+eagle, 6 nodes", on("hybrid:suffix+eagle", 6),
           ("suffix", "eagle")),
    # gated: the suffix tree's chain alone where it matched, else the EAGLE head's chain (no
    # head drafting and no wider tree on a step retrieval covers)
    Config("gated", "gated: suffix, else eagle, k=4", on("hybrid:suffix|eagle", 4),
           ("suffix", "eagle")),
    Config("gated-ngram", "gated: ngram, else eagle, k=4", on("hybrid:ngram|eagle", 4),
           ("ngram", "eagle")),
    # the two retrieval methods, both cheap: merged where both match, a tree where they differ
    Config("retrieval", "hybrid ngram+suffix, 6 nodes", on("hybrid:ngram+suffix", 6),
           ("ngram", "suffix")),
    # the suffix tree's match (2 tokens at least, drafting as far as it is sure) first, prompt
    # lookup where it found none: both cheap, one chain a step
    Config("retrieval-gated", "gated: suffix, else ngram, k=4", on("hybrid:suffix|ngram", 4),
           ("suffix", "ngram")),
    Config("auto", "auto", {"mode": "auto"}, ALL_METHODS),
]
# every method once, PLD's shape, and the gated hybrids suffix|eagle and suffix|ngram; the rest
# are asked by name (--configs ... eagle-tree gated-ngram retrieval): at 256 new tokens a
# configuration costs 4-7 minutes of this CPU (plus 1-2 for --seeded at 64), Hugging Face 9
BY_NAME = ("eagle-tree", "gated-ngram", "retrieval")
DEFAULT = tuple(c.key for c in CONFIGS if c.key not in BY_NAME)
REPEAT_DEFAULT = "suffix"  # the cross-request method: what a repeated question changes most


def parse_extra(item: str) -> Config:
    """KEY=JSON@METHOD,METHOD (the label is the key)."""
    key, _, rest = item.partition("=")
    spec, _, methods = rest.rpartition("@") if "@" in rest else (rest, "", "")
    try:
        speculation = json.loads(spec)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--config {item!r}: the speculation is not JSON ({exc})") from None
    if not key or not isinstance(speculation, dict) or "mode" not in speculation:
        raise ValueError(f"--config {item!r}: want KEY={{\"mode\": ...}}@METHOD,...")
    return Config(key, key, speculation, tuple(m for m in methods.split(",") if m))


def select(keys: list[str], extra: list[Config]) -> list[Config]:
    """The configurations named, in the order given, off first whatever the order (the
    lossless check compares every other one with it)."""
    known = {c.key: c for c in [*CONFIGS, *extra]}
    unknown = [k for k in keys if k not in known]
    if unknown:
        raise ValueError(f"unknown configuration(s) {unknown}; known: {sorted(known)}")
    chosen = [known[k] for k in dict.fromkeys(["off", *keys])]
    return chosen
