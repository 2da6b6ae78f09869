"""Create tests/fixtures/tiny-llama: a tiny random-weight Llama checkpoint with a small
byte-level BPE tokenizer, for fast tests of the proposers. It is not a useful language model.

    python scripts/make_tiny_model.py [--out tests/fixtures/tiny-llama]
"""

from __future__ import annotations

import argparse
import sysconfig
from pathlib import Path

import torch
from tokenizers import ByteLevelBPETokenizer
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

EOS = "<|endoftext|>"


def corpus_files(n: int) -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [str(p) for p in sorted(stdlib.glob("*.py"))[:n]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="tests/fixtures/tiny-llama")
    ap.add_argument("--vocab-size", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    bpe = ByteLevelBPETokenizer()
    bpe.train(corpus_files(40), vocab_size=args.vocab_size, min_frequency=2,
              special_tokens=[EOS], show_progress=False)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token=EOS, eos_token=EOS,
                                  unk_token=EOS, model_max_length=2048)
    tok.save_pretrained(out)

    torch.manual_seed(args.seed)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=172,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2048, initializer_range=0.08,
                         bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
                         tie_word_embeddings=True)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote {out} ({n / 1e6:.2f}M parameters, vocab {len(tok)})")


if __name__ == "__main__":
    main()
