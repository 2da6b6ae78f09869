"""One structured request's grammar state: an xgrammar GrammarMatcher that has accepted exactly
the request's committed output, walked over each step's draft without being moved by it.

Per step (verifier_service/step/sampling_state.py), `fill_rows` writes one bitmask row per
verified row of the sequence: its root row (the state after the committed output), then one per
draft node, the state after that node's own path from the root. The walk is depth-first: accept
a child's token, fill its row, go down, roll back on the way up, so a node never sees a
sibling's token. The bonus row after the last node is that node's row (kernels/layout.py: a
node's row picks the token after it). Before the step is planned, `kept_nodes` says which
draft nodes the grammar allows (a forbidden node and its subtree would be rejected for
certain). After the step, `accept` takes the tokens the step emitted, and nothing else.

A row after the structure is complete (the matcher accepted a stop token: terminated) allows
the stop tokens only; it is never an empty row (an all -inf row has no distribution).
"""

from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["GrammarState", "children_of"]


def children_of(parents: Sequence[int]) -> dict[int, list[int]]:
    """Each node's children in node order (-1: the root's)."""
    out: dict[int, list[int]] = {-1: []}
    for node, parent in enumerate(parents):
        out.setdefault(parent, []).append(node)
        out.setdefault(node, [])
    return out


class GrammarState:
    """A request's matcher over a compiled grammar (verifier_service/grammar/compiler.py)."""

    def __init__(self, compiled, vocab_size: int):
        import xgrammar as xgr

        self._xgr = xgr
        self.matcher = xgr.GrammarMatcher(compiled)
        self.vocab_size = vocab_size
        self.stop_token_ids = tuple(self.matcher.stop_token_ids)

    @property
    def terminated(self) -> bool:
        """The structure is complete and a stop token was accepted: the request is done."""
        return self.matcher.is_terminated()

    def accept(self, tokens: Sequence[int]) -> bool:
        """The step's emitted tokens, committed; False if the grammar refuses one (the masks
        make that impossible: a refusal is a bug, and fails the request)."""
        for t in tokens:
            if self.matcher.is_terminated() or not self.matcher.accept_token(int(t)):
                return False
        return True

    def complete_within(self, tokens: Sequence[int]) -> int:
        """How many of `tokens` (a step's emitted tokens) the request keeps: up to and
        including the one that completes the structure (the stop token the matcher terminates
        on), all of them if none does. A bonus row after that token allows the stop tokens only,
        so a step may emit one more; it is not output. The matcher is left as found."""
        m, taken = self.matcher, 0
        for t in tokens:
            if m.is_terminated() or not m.accept_token(int(t)):
                break
            taken += 1
        done = m.is_terminated()
        if taken:
            m.rollback(taken)
        return taken if done else len(tokens)

    def kept_nodes(self, tokens: Sequence[int], parents: Sequence[int]) -> list[int]:
        """The draft nodes the grammar allows after the committed output, in node order: a
        node whose token the grammar forbids after its path goes, with its subtree."""
        kept: list[int] = []
        children = children_of(parents)
        m = self.matcher

        def visit(node: int) -> None:
            for child in children[node]:
                if not m.is_terminated() and m.accept_token(int(tokens[child])):
                    kept.append(child)
                    visit(child)
                    m.rollback(1)

        visit(-1)
        return sorted(kept)

    def fill_rows(self, tokens: Sequence[int], parents: Sequence[int], bitmask: torch.Tensor,
                  first: int) -> None:
        """bitmask (int32 [R, ceil(V / 32)] on the host) rows first .. first + len(tokens):
        the root row's mask, then each draft node's (the grammar after its own path). A node
        the grammar refuses (never the case for a pruned draft) gets its parent's row: it
        cannot be accepted, so its row is never read, but it must stay a distribution."""
        children = children_of(parents)
        m = self.matcher

        def visit(node: int, row: int) -> None:
            self._fill(bitmask, row)
            for child in children[node]:
                if not m.is_terminated() and m.accept_token(int(tokens[child])):
                    visit(child, first + 1 + child)
                    m.rollback(1)
                else:
                    for n in _subtree(children, child):
                        bitmask[first + 1 + n] = bitmask[row]

        visit(-1, first)

    def _fill(self, bitmask: torch.Tensor, row: int) -> None:
        if self.matcher.is_terminated():  # complete: only a stop token may follow
            bitmask[row].zero_()
            for t in self.stop_token_ids:
                bitmask[row, t // 32] |= _bit(t % 32)
            return
        self.matcher.fill_next_token_bitmask(bitmask, row)

    def jump_forward(self) -> str:
        """The text the grammar forces from here (xgrammar's jump-forward string; "" when the
        next character is not certain)."""
        if self.matcher.is_terminated():
            return ""
        return self.matcher.find_jump_forward_string()

    def forced_tokens(self, spell, k: int) -> tuple[list[int], int | None, bool]:
        """Up to k tokens of the text the grammar forces after the committed output (spell:
        text -> (the ids to draft, the last token held back or None), as
        verifier_service/methods/forced_spelling.py spells it: a last token a longer one could
        extend is held back, since what the model writes next may merge into it across the forced
        text's end). Only tokens the grammar accepts in turn are kept (a spelling the grammar
        does not take is no draft); the matcher is left as found. Returns (the tokens, the
        token held back, whether the tokens spell all of the forced text but that one)."""
        text = self.jump_forward()
        if not text or k <= 0:
            return [], None, False
        ids, held = spell(text)
        out: list[int] = []
        for t in ids[:k]:
            if not self.matcher.accept_token(int(t)):
                break
            out.append(int(t))
        if out:
            self.matcher.rollback(len(out))
        whole = len(out) == len(ids)
        return out, held if whole else None, whole


def _bit(j: int) -> int:
    """Bit j of an int32 word, as a Python int of the word's signed value."""
    return (1 << j) if j < 31 else -(1 << 31)


def _subtree(children: dict[int, list[int]], node: int) -> list[int]:
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        out.append(n)
        stack.extend(children[n])
    return out
