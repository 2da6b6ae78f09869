"""Spec-Bench's published rows for Vicuna-7B-v1.3, beside which bench/specbench.py sets its own:
another model, on another device, against another baseline. From Leaderboard.md of
https://github.com/hemingkx/Spec-Bench at commit fd2c1cd (2025-04-22; Apache-2.0): greedy,
FP16, batch 1, the mean speed-up over 3 runs against the same model's plain autoregressive
decoding in Hugging Face transformers, and #MAT.

Per row: MT-bench, translation, summarization, QA, math reasoning, RAG, #MAT, overall.
"""

from __future__ import annotations

SOURCE = ("Spec-Bench Leaderboard.md (github.com/hemingkx/Spec-Bench, commit fd2c1cd, "
          "Apache-2.0)")

DEVICES = {
    "RTX 3090": "one NVIDIA GeForce RTX 3090 (24 GB), 12 CPU cores, PyTorch 2.5.1, CUDA 12.1",
    "A100": "one NVIDIA A100 (80 GB), 96 CPU cores, PyTorch 2.5.1, CUDA 11.5",
}

VICUNA_7B = {
    "RTX 3090": [
        ("SAM-Decoding + EAGLE-2", 2.85, 1.83, 2.64, 2.15, 2.63, 2.10, 4.61, 2.38),
        ("EAGLE-2", 2.56, 1.78, 2.09, 2.07, 2.66, 1.86, 4.35, 2.19),
        ("EAGLE", 2.31, 1.72, 2.00, 1.91, 2.38, 1.75, 3.57, 2.03),
        ("Hydra", 2.18, 1.79, 1.66, 1.85, 2.28, 1.62, 3.26, 1.91),
        ("SpS (draft model)", 1.94, 1.37, 1.96, 1.86, 1.81, 1.83, 2.28, 1.79),
        ("PLD (prompt lookup)", 1.64, 1.15, 2.46, 1.28, 1.72, 1.71, 1.73, 1.64),
        ("Medusa", 1.61, 1.39, 1.28, 1.40, 1.64, 1.25, 2.32, 1.44),
        ("Token Recycling", 1.42, 1.29, 1.43, 1.30, 1.59, 1.36, 2.73, 1.40),
        ("REST", 1.44, 1.15, 1.17, 1.35, 1.30, 1.26, 1.63, 1.28),
        ("Lookahead", 1.17, 1.00, 1.11, 1.06, 1.32, 1.06, 1.64, 1.13),
    ],
    "A100": [
        ("SAM-Decoding + EAGLE-2", 3.30, 2.01, 3.19, 2.36, 2.96, 2.52, 4.58, 2.73),
        ("EAGLE-2", 2.84, 1.88, 2.34, 2.15, 2.79, 2.13, 4.34, 2.36),
        ("Token Recycling", 2.37, 2.02, 2.27, 2.08, 2.53, 2.02, 2.73, 2.22),
        ("EAGLE", 2.45, 1.77, 2.08, 1.93, 2.44, 1.87, 3.58, 2.10),
        ("Hydra", 2.43, 1.89, 1.83, 1.97, 2.45, 1.80, 3.26, 2.07),
        ("Medusa", 1.97, 1.65, 1.57, 1.65, 1.94, 1.49, 2.31, 1.71),
        ("PLD (prompt lookup)", 1.60, 1.06, 2.66, 1.19, 1.62, 1.86, 1.75, 1.66),
        ("SpS (draft model)", 1.66, 1.13, 1.71, 1.50, 1.47, 1.66, 2.28, 1.52),
        ("REST", 1.63, 1.31, 1.36, 1.66, 1.21, 1.73, 1.82, 1.48),
        ("Lookahead", 1.47, 1.14, 1.36, 1.25, 1.57, 1.22, 1.64, 1.34),
    ],
}
