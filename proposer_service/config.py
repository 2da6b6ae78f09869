"""Configuration of one proposer process."""

from __future__ import annotations

from dataclasses import dataclass

from splitspec.config import option
from splitspec.methods import proposer_methods
from splitspec.tls_options import TlsPeerOptions, TlsServerOptions


@dataclass(frozen=True)
class ProposerConfig(TlsServerOptions, TlsPeerOptions):
    """Serve one proposer method over gRPC."""

    method: str = option("ngram", "the speculation method this proposer serves",
                         choices=tuple(proposer_methods()))
    host: str = option("127.0.0.1", "address to listen on")
    port: int = option(50052, "gRPC port")
    # Learned proposers (draft, mlp): their own model, device and dtype, independent of the target.
    model: str = option("", "model directory: a causal LM (draft) or an MLP speculator (mlp)")
    tokenizer: str = option("", "tokenizer directory (default: the draft's own directory; for mlp "
                                "the target directory recorded in the speculator's config)")
    device: str = option("auto", "cpu | cuda | mlu | auto")
    dtype: str = option("auto", "float32 | bfloat16 | float16 | auto (fp32 on cpu, bf16 otherwise)")
    trust_remote_code: bool = option(False, "allow model code shipped in the model directory")
    # draft only: the model from config.json alone, seeded random weights
    # (splitspec/dummy_weights.py)
    load_format: str = option("auto", "draft: auto (the directory's weights) | dummy (random "
                              "weights from config.json alone; drafts meaningless)",
                              choices=("auto", "dummy"))
    load_seed: int = option(0, "seed of --load-format dummy's random weights")
    # Sampled drafts send their distribution restricted to its K most likely tokens: larger K
    # keeps more of q (higher acceptance) at the price of a larger message per draft token.
    draft_top_k: int = option(32, "K of the sparse draft distribution sent with sampled drafts")
    max_batch: int = option(32, "sequences drafted together in one forward pass")
    threads: int = option(0, "torch intra-op threads (0: $OMP_NUM_THREADS, which "
                          "`splitspec up` and the chart set per service, else torch's default)")
    # draft only: its lean forward split over N devices (proposer_service/draft/tp.py)
    tensor_parallel_size: int = option(
        1, "draft: devices the draft model is split over (tensor parallel; its KV head count "
        "must be a multiple); the proposer starts one process per device")
    # kernels/linear.py
    linear: str = option("auto", "matmul kernels of the model: dense (plain), onednn, fp16 "
                         "(FBGEMM) or fp16-dot (split over every thread; weights packed once); "
                         "auto picks one that suits this machine",
                         choices=("auto", "dense", "onednn", "fp16", "fp16-dot"))
    # FR-Spec: a head scoring only the most frequent tokens (splitspec/vocab_frequencies.py)
    vocab_subset: str = option("auto", "draft/mlp: score only the N most frequent tokens of the "
                                       "model directory's token_frequencies.json in the output "
                                       "head (auto: the size it recommends; 0: every token)")
    ngram_min: int = option(1, "shortest suffix the n-gram proposer matches")
    ngram_max: int = option(4, "longest suffix the n-gram proposer matches")
    max_num_speculative_tokens: int = option(16, "largest k this proposer serves")
    method_option: tuple[str, ...] = option(
        (), "a method-specific setting as KEY=VALUE (see the method's docs), e.g. max_depth=32")
    idle_timeout_s: float = option(600.0, "forget a sequence not heard of for this long")
    # draft: a new sequence starts from the draft cache of one (running or finished) whose
    # tokens it starts with (proposer_service/draft/prefix.py); vLLM's flag name
    enable_prefix_caching: bool = option(True, "draft: reuse the draft's KV of shared prefixes")
    prefix_cache_memory_mb: int = option(256, "draft: memory for finished sequences' draft KV")
    # draft: running sequences' KV resident in one preallocated cache, a slot each
    # (proposer_service/draft/slots.py); sequences beyond keep their own tensors
    draft_cache_slots: int = option(64, "draft: sequences whose draft KV is resident (0: none, "
                                        "every sequence on the per-sequence path)")
    draft_cache_memory_mb: int = option(512, "draft: memory of the resident draft KV (fewer "
                                             "slots when they do not fit)")
    # draft, on a device with graphs: these k values' whole drafting loop captured as one graph
    # (proposer_service/draft/graphs.py), replayed once per step instead of k times
    draft_graph_chain_k: tuple[int, ...] = option(
        (), "draft: k values whose k drafting iterations are captured as one graph")
    log_level: str = option("INFO", "logging level")

    def method_options(self) -> dict[str, str]:
        """--method-option KEY=VALUE pairs as a dict (a malformed one exits with its name)."""
        out = {}
        for item in self.method_option:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise SystemExit(f"error: --method-option expects KEY=VALUE, got {item!r}")
            out[key.strip()] = value.strip()
        return out
