"""Test GGUF files and wheels, written here from a Hugging Face Llama directory.

`write_llama_gguf` writes what llama.cpp's converter writes for a Llama checkpoint with a
byte-level BPE tokenizer: the hyper-parameters under llama.* keys, the vocabulary, merges and
special ids under tokenizer.ggml.*, the chat template, and the tensors under GGUF names with Q and
K rows permuted the way llama.cpp lays out RoPE pairs. Tensors are F32 (or F16), so the import
must reproduce the source weights exactly. `write_wheel` packs a file into a minimal wheel.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

CHAT_TEMPLATE = ("{% for m in messages %}<|endoftext|>{{ m['role'] }}\n{{ m['content'] }}\n"
                 "{% endfor %}{% if add_generation_prompt %}<|endoftext|>assistant\n{% endif %}")

_LAYER_TENSORS = {  # HF name inside model.layers.N -> GGUF name inside blk.N
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
}


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's row order for Q/K: [out, in] with each head's two RoPE halves interleaved."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def write_llama_gguf(model_dir: str | Path, path: str | Path, dtype=np.float32,
                     chat_template: str = CHAT_TEMPLATE) -> Path:
    import gguf

    model_dir, path = Path(model_dir), Path(path)
    cfg = json.loads((model_dir / "config.json").read_text())
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    weights = load_file(model_dir / "model.safetensors")
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]

    w = gguf.GGUFWriter(path, "llama")
    w.add_name(model_dir.name)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(cfg.get("head_dim") or cfg["hidden_size"] // heads)
    w.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])

    vocab = tok["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = {a["id"] for a in tok["added_tokens"] if a["special"]}
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3 if i in special else 1 for i in range(len(tokens))])  # 3: control
    w.add_token_merges([" ".join(m) if isinstance(m, list) else m
                        for m in tok["model"]["merges"]])
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    w.add_chat_template(chat_template)

    def add(name: str, t: torch.Tensor) -> None:
        a = t.float().numpy()
        w.add_tensor(name, a.astype(np.float32 if a.ndim == 1 else dtype))  # norms stay F32

    add("token_embd.weight", weights["model.embed_tokens.weight"])
    for i in range(cfg["num_hidden_layers"]):
        for hf, gg in _LAYER_TENSORS.items():
            t = weights[f"model.layers.{i}.{hf}"]
            if gg == "attn_q.weight":
                t = torch.from_numpy(_permute(t.numpy(), heads))
            elif gg == "attn_k.weight":
                t = torch.from_numpy(_permute(t.numpy(), kv_heads))
            add(f"blk.{i}.{gg}", t)
    add("output_norm.weight", weights["model.norm.weight"])
    if not cfg.get("tie_word_embeddings", False):
        add("output.weight", weights["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def write_wheel(directory: Path, package: str, version: str, member: str, payload: Path) -> Path:
    """A minimal pure-Python wheel of `package` holding `payload` at `member`."""
    dist = f"{package.replace('-', '_')}-{version}"
    wheel = directory / f"{dist}-py3-none-any.whl"
    files = {
        member: payload.read_bytes(),
        f"{dist}.dist-info/METADATA":
            f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n".encode(),
        f"{dist}.dist-info/WHEEL":
            b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in files) + f"{dist}.dist-info/RECORD,,\n"
    directory.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr(f"{dist}.dist-info/RECORD", record)
    return wheel
