"""Held-out chat and code prompts for benchmarking a chat model (`--prompt-set chat`).

Written for the benchmark and used nowhere else: no training script reads this file (the real
model's speculators are trained on prompts built from the Python standard library's train split
and pydoc topics, scripts/train_real.py), so every prompt here is unseen. Half ask for prose,
half for code, alternating, so a run of any length is balanced. Each is sent through the model's
own chat template (one user turn, the generation prompt appended), as a chat client would.
"""

from __future__ import annotations

CHAT = [
    "What are three things to check before going on a long bike ride?",
    "Explain in simple words why the sky looks blue during the day.",
    "Give me a short packing list for a weekend camping trip.",
    "Why do cats purr? Answer in two or three sentences.",
    "Write a polite email asking a colleague to move our meeting to Thursday.",
    "What is the difference between weather and climate?",
    "Suggest a simple vegetarian dinner I can cook in twenty minutes.",
    "How can I get better at remembering people's names?",
    "Summarise the water cycle for a ten-year-old.",
    "List some good habits for keeping a small garden healthy.",
    "What should I do if my phone battery drains very fast?",
    "Describe a calm morning routine in a few sentences.",
]

CODE = [
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Write a Python function that checks whether a string is a palindrome, ignoring case.",
    "Write a Python function that counts how often each word appears in a text.",
    "Write a Python class for a simple stack with push, pop and peek methods.",
    "Write a Python function that merges two sorted lists into one sorted list.",
    "Write a Python function that reads a CSV file and returns the rows as dictionaries.",
    "Write a Python function that removes duplicate items from a list but keeps the order.",
    "Write a Python function that converts a temperature from Celsius to Fahrenheit.",
    "Write a Python function that finds the largest number in a list without using max().",
    "Write a Python function that returns all prime numbers below n.",
    "Write a Python function that reverses the words in a sentence.",
    "Write a Python function that flattens a nested list of integers.",
]


def chat_prompts(tokenizer, n: int) -> list[str]:
    """n prompts alternating chat and code, each rendered by the tokenizer's chat template."""
    mixed = [p for pair in zip(CHAT, CODE) for p in pair]
    if n > len(mixed):
        raise ValueError(f"at most {len(mixed)} chat prompts, asked {n}")
    return [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                          add_generation_prompt=True) for p in mixed[:n]]
