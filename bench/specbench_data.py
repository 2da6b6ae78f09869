"""Spec-Bench's questions for bench/specbench.py: the six groups, the questions a run takes from
each, and a conversation's prompt ids through the model's chat template.

The questions are bench/data/spec_bench/question.jsonl (a held-out quarter of Spec-Bench's; its
README.md says where from). A question has one turn, or two for MT-bench; as Spec-Bench does, a
second turn's prompt is the whole conversation so far, the model's own first answer included,
rendered again by the chat template (Spec-Bench keeps the first answer as decoded text, special
tokens left out, stripped).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUESTIONS = ROOT / "bench/data/spec_bench/question.jsonl"

# (group, its column label): Spec-Bench's order; MT-bench is eight categories
GROUPS = {"mt_bench": "MT-bench", "translation": "Translation",
          "summarization": "Summarization", "qa": "QA", "math_reasoning": "Math reasoning",
          "rag": "RAG"}
MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem",
            "humanities")


@dataclass(frozen=True)
class Question:
    question_id: int
    group: str  # a key of GROUPS
    category: str  # Spec-Bench's own (MT-bench's eight, else the group)
    turns: tuple[str, ...]


def group_of(category: str) -> str:
    if category in MT_BENCH:
        return "mt_bench"
    if category in GROUPS:
        return category
    raise ValueError(f"unknown Spec-Bench category {category!r}")


def load(path: str | Path = QUESTIONS) -> list[Question]:
    out = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            q = json.loads(line)
            out.append(Question(int(q["question_id"]), group_of(q["category"]), q["category"],
                                tuple(q["turns"])))
    return out


def pick(questions: list[Question], per_group: int | None,
         groups: tuple[str, ...] = tuple(GROUPS)) -> list[Question]:
    """The first `per_group` questions of each group in file order (None: all of them), group
    by group in Spec-Bench's order. MT-bench's are spread over its categories: its first
    question of each category, then its second, and so on."""
    out = []
    for g in groups:
        mine = [q for q in questions if q.group == g]
        if g == "mt_bench":
            by_cat = [[q for q in mine if q.category == c] for c in MT_BENCH]
            mine = [qs[i] for i in range(max(map(len, by_cat), default=0))
                    for qs in by_cat if i < len(qs)]
        out += mine if per_group is None else mine[:per_group]
    return out


class ChatPrompts:
    """A conversation's prompt ids as the verifier would encode its messages: the tokenizer's
    chat template (the verifier's default when it has none) with the assistant's turn opened,
    then the tokenizer without special tokens. `max_prompt_tokens` keeps only a prompt's last
    that many ids (for a target whose context is short, e.g. the toy family's 512)."""

    def __init__(self, tokenizer, max_prompt_tokens: int | None = None):
        from verifier_service.prompt import DEFAULT_CHAT_TEMPLATE

        self.tok = tokenizer
        self.template = getattr(tokenizer, "chat_template", None) or DEFAULT_CHAT_TEMPLATE
        self.max_prompt_tokens = max_prompt_tokens

    def ids(self, turns: list[str], answers: list[str]) -> list[int]:
        """The prompt for turn len(answers): every earlier turn with its answer, then this one."""
        messages = []
        for i, turn in enumerate(turns[:len(answers) + 1]):
            messages.append({"role": "user", "content": turn})
            if i < len(answers):
                messages.append({"role": "assistant", "content": answers[i]})
        text = self.tok.apply_chat_template(messages, chat_template=self.template,
                                            tokenize=False, add_generation_prompt=True)
        ids = self.tok.encode(text, add_special_tokens=False)
        return ids[-self.max_prompt_tokens:] if self.max_prompt_tokens else ids

    def answer_text(self, ids: list[int]) -> str:
        """An answer as the next turn's prompt holds it (Spec-Bench: decoded, special tokens
        left out, stripped)."""
        return self.tok.decode(ids, skip_special_tokens=True).strip()
