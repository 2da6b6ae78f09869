"""Broad training requests for the real chat model's EAGLE head, written from templates (no model
call, so any number of them costs nothing), and the overlap filter that keeps them clear of the
held-out set (scripts/eagle_heldout.py) and of Spec-Bench's questions.

Templates cross the everyday and programming topics of scripts/eagle_topics.py with request forms
that cover MT-bench-like chat broadly (writing, role-play, explanation, advice, reasoning,
extraction, comparison, maths, coding); arithmetic word problems get seeded random numbers. The
list is shuffled with a fixed seed, so any prefix of it is a balanced mix, and a prompt's text is
its identity (scripts/eagle_engine_data.py resumes by text).

Overlap: a request is dropped when it shares WORD_NGRAM (8) consecutive words with any turn of
any of Spec-Bench's 480 questions (the whole set, hemingkx/Spec-Bench data/spec_bench/
question.jsonl, including the questions the project's bench leaves out), or with a held-out
prompt, or when it is short and appears word for word inside one (scripts/eagle_data.py:overlaps).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import eagle_data as ed
import eagle_topics as et

CHAT_TEMPLATES = (
    ("writing", "Write a short poem about {t}."),
    ("writing", "Write a short story for children that involves {t}."),
    ("writing", "Write a friendly email to a colleague about {t}."),
    ("writing", "Write a blog post introduction about {t}."),
    ("writing", "Write a persuasive paragraph arguing that everyone should care about {t}."),
    ("writing", "Write a haiku about {t}, then explain the image it uses."),
    ("writing", "Write a short dialogue between two friends talking about {t}."),
    ("writing", "Write a catchy slogan and a one-paragraph advert about {t}."),
    ("role-play", "Pretend you are an expert on {t}. Introduce yourself and share your best tip."),
    ("role-play", "Act as a teacher giving a five-minute lesson on {t}."),
    ("role-play", "Imagine you are a radio host. Open today's show, which is about {t}."),
    ("explanation", "Explain {t} to a ten-year-old."),
    ("explanation", "What are the most important facts everyone should know about {t}?"),
    ("explanation", "Describe the history of {t} in a few paragraphs."),
    ("explanation", "What are common misconceptions about {t}?"),
    ("explanation", "Give me a short overview of {t}."),
    ("advice", "Give me five practical tips about {t}."),
    ("advice", "I am a complete beginner. How do I get started with {t}?"),
    ("advice", "What mistakes should I avoid when it comes to {t}?"),
    ("advice", "Make a simple one-week plan to get better at {t}."),
    ("comparison", "What are the pros and cons of {t}?"),
    ("comparison", "Compare {t} with {u}: how are they alike and how do they differ?"),
    ("reasoning", "Give three arguments for and three against spending more time on {t}."),
    ("reasoning", "Why might someone find {t} difficult, and how could they overcome that?"),
    ("extraction", "List five words that come to mind when you think of {t}, and explain each."),
    ("extraction", "Summarise in three bullet points why {t} matters."),
    ("humanities", "How has {t} changed over the last hundred years?"),
    ("humanities", "What role does {t} play in different cultures?"),
)

CODE_TEMPLATES = (
    ("programming", "Write a Python function that demonstrates {t}, with a short explanation."),
    ("programming", "Write a small Python program that uses {t} and print its output."),
    ("programming", "Show me an example of {t} in Python and explain each line."),
    ("programming", "Write unit tests for a Python function that works with {t}."),
    ("code questions", "What are common mistakes beginners make with {t}?"),
    ("code questions", "Explain {t} in Python with two short code examples."),
    ("code questions", "When should I use {t}, and when should I avoid it?"),
    ("code questions", "How do {t} and {u} differ in programming?"),
)

NAMES = ("Anna", "Ben", "Carla", "David", "Elif", "Farah", "George", "Hana", "Ivan", "Julia",
         "Kofi", "Lena", "Mateo", "Nina", "Omar", "Priya")
ITEMS = ("apples", "books", "pencils", "stickers", "cookies", "marbles", "tickets", "plants",
         "cards", "shells")
MATH_TEMPLATES = (
    "{n} has {a} {i}. She buys {b} more and gives away {c}. How many {i} does she have now?",
    "{n} reads {a} pages a day. How many pages does {n} read in {b} weeks?",
    "A box holds {a} {i}. How many boxes are needed for {p} {i}?",
    "{n} earns {a} dollars an hour and works {b} hours a week. How much is that in {c} weeks?",
    "A shop sells {i} at {a} dollars each, with {b} percent off. What do {c} of them cost?",
    "A car travels {p} km in {b} hours. What is its average speed, and how far does it go in "
    "{c} hours at that speed?",
    "A rectangle is {a} cm long and {b} cm wide. What are its area and its perimeter?",
    "{n} saves {a} dollars a month. How many months until {n} has {p} dollars?",
    "The price of a ticket rose from {a} to {p} dollars. By what percent did it rise?",
    "What is {a} times {b}, minus {c}? Show your working step by step.",
)


def _pairs(topics: tuple[str, ...], rng: random.Random) -> list[str]:
    other = list(topics)
    rng.shuffle(other)
    return other


def build_prompts(seed: int = 0, maths: int = 600) -> list[dict]:
    """Every templated request, deduplicated and shuffled with `seed`: dicts with kind ("chat" /
    "code"), category and prompt."""
    rng = random.Random(seed)
    out = []
    for topics, templates, kind in ((et.EVERYDAY, CHAT_TEMPLATES, "chat"),
                                    (et.CODE_TOPICS, CODE_TEMPLATES, "code")):
        other = _pairs(topics, rng)
        for j, t in enumerate(topics):
            u = other[j] if other[j] != t else other[(j + 1) % len(other)]
            for cat, tpl in templates:
                out.append({"kind": kind, "category": cat, "prompt": tpl.format(t=t, u=u)})
    for _ in range(maths):
        a, b, c = rng.randint(2, 60), rng.randint(2, 12), rng.randint(2, 9)
        tpl = rng.choice(MATH_TEMPLATES)
        out.append({"kind": "chat", "category": "maths", "prompt": tpl.format(
            n=rng.choice(NAMES), i=rng.choice(ITEMS), a=a, b=b, c=c, p=a * b + rng.randint(1, 50))})
    seen, uniq = set(), []
    for it in out:
        if it["prompt"] not in seen:
            seen.add(it["prompt"])
            uniq.append(it)
    random.Random(seed + 1).shuffle(uniq)
    return uniq


def specbench_texts(path: Path) -> list[str]:
    """Every turn of every question of Spec-Bench's question.jsonl (each turn one text)."""
    texts = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            texts += [t for t in json.loads(line)["turns"] if t]
    return texts


def split_overlapping(items: list[dict], refs: list[str], n: int = ed.WORD_NGRAM
                      ) -> tuple[list[dict], list[dict]]:
    """(kept, dropped): an item is dropped when its prompt overlaps any reference text (shares n
    consecutive words, or a short one appears inside; eagle_data.overlaps). The references' n-grams
    are indexed once, so the whole Spec-Bench set against thousands of prompts stays cheap."""
    index: set[tuple[str, ...]] = set()
    joined = []
    for r in refs:
        index |= ed.ngrams(r, n)
        joined.append(" " + " ".join(ed._words(r)) + " ")
    kept, dropped = [], []
    for it in items:
        words = ed._words(it["prompt"])
        hit = bool(ed.ngrams(it["prompt"], n) & index)
        if not hit and len(words) < n:
            needle = " " + " ".join(words) + " "
            hit = any(needle in j for j in joined)
        if not hit:  # a short reference inside the prompt
            mine = " " + " ".join(words) + " "
            hit = any(len(j.split()) < n and j in mine for j in joined if j.strip())
        (dropped if hit else kept).append(it)
    return kept, dropped


def shared_ngram_counts(items: list[dict], refs: list[str], sizes=(4, 5, 6, 8)) -> dict:
    """For the report: how many prompts share at least one word n-gram with the references, for
    several n (short n-grams are the phrasing every request shares, long ones copied text)."""
    out = {}
    for n in sizes:
        index = set().union(*(ed.ngrams(r, n) for r in refs)) if refs else set()
        out[n] = sum(bool(ed.ngrams(it["prompt"], n) & index) for it in items)
    return out
