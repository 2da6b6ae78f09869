"""Configuration of one verifier process."""

from __future__ import annotations

from dataclasses import dataclass

from splitspec.config import DEFAULT_MODEL, option
from splitspec.tls_options import TlsClientOptions, TlsPeerOptions, TlsServerOptions

__all__ = ["DEFAULT_MODEL", "VerifierConfig"]


@dataclass(frozen=True)
class VerifierConfig(TlsServerOptions, TlsPeerOptions, TlsClientOptions):
    """Serve a target model with speculative decoding over gRPC."""

    model: str = option(DEFAULT_MODEL, "local directory of the target model (Hugging Face format)")
    served_model_name: str = option("", "model id reported to clients (default: directory name)")
    host: str = option("127.0.0.1", "address to listen on")
    port: int = option(50051, "gRPC port")
    device: str = option("auto", "cpu | cuda | mlu | auto")
    dtype: str = option("auto", "float32 | bfloat16 | float16 | auto (fp32 on cpu, bf16 otherwise)")
    trust_remote_code: bool = option(False, "allow model code shipped in the model directory")
    # dummy: the model (and an --eagle head) from config.json alone with seeded random weights
    # made on the device, for measuring real shapes (models/shapes/; splitspec/dummy_weights.py)
    load_format: str = option("auto", "auto: the directory's weights; dummy: random weights "
                              "from config.json alone (output meaningless)",
                              choices=("auto", "dummy"))
    load_seed: int = option(0, "seed of --load-format dummy's random weights")
    # vLLM's --seed: the random generator unseeded sampled requests draw from, seeded once at
    # start-up, so a restarted verifier given the same requests in the same order draws the
    # same tokens (a request's own `seed` needs none of this)
    seed: int = option(-1, "seed of the random generator unseeded requests draw from "
                       "(-1: not seeded)")
    proposer: tuple[str, ...] = option(
        (),
        "a proposer as METHOD=HOST:PORT, e.g. ngram=127.0.0.1:50052; a HOST with several "
        "addresses (a headless Service) or a list HOST:PORT,HOST:PORT is a pool of them",
    )
    default_num_speculative_tokens: int = option(4, "k used when a request does not set one")
    max_num_speculative_tokens: int = option(8, "largest k a request may ask for")
    eagle: str = option("", "an EAGLE-1/2 or EAGLE-3 head for this target (a directory as "
                        "published, or as the speculators library saves it): serves the "
                        "in-target method eagle (default: none, not served)")
    eagle_vocab_subset: str = option(
        "auto", "eagle: an EAGLE-1/2 head (scoring with the target's output head) scores only "
        "the N most frequent tokens of its directory's token_frequencies.json (auto: the file's "
        "recommended subset if there is one; 0: every token)")
    lookahead_window: int = option(3, "lookahead decoding: W, guesses per Jacobi level")
    lookahead_ngram: int = option(3, "lookahead decoding: N, n-gram size (N - 1 window levels)")
    lookahead_guesses: int = option(2, "lookahead decoding: G, pool n-grams verified per step")
    max_num_branches: int = option(
        4, "most children per draft node a request may ask for (token trees; 1: chains only)")
    proposer_timeout_ms: float = option(
        250.0, "per-step deadline for proposals; late ones are dropped"
    )
    proposer_reconnect_s: float = option(
        1.0, "least time between reconnection attempts to a proposer"
    )
    proposer_resolve_interval_s: float = option(
        5.0, "how often proposer host names are looked up again (pods that came or went)"
    )
    # Drafting ahead: proposers that declare drafts_ahead draft the next step for the likely
    # outcomes while this one is verified; a hit saves the proposer's drafting time.
    # auto: per method, whichever measures cheaper per token
    # (verifier_service/drafts/ahead_policy.py)
    draft_ahead: str = option("auto", "ask proposers that can to draft ahead while verifying",
                              choices=("auto", "on", "off"), aliases=("--overlap",))
    max_num_seqs: int = option(8, "sequences decoded together (running batch)")
    max_num_batched_tokens: int = option(
        2048, "tokens per step; longer prompts are prefilled in chunks (0: no limit)"
    )
    max_waiting: int = option(
        256, "queued requests beyond the running batch; more get RESOURCE_EXHAUSTED"
    )
    block_size: int = option(16, "tokens per KV cache block")
    kv_cache_memory_mb: int = option(512, "memory for the paged KV cache (K and V, all layers)")
    num_kv_blocks: int = option(0, "KV cache blocks (0: from --gpu-memory-utilization or "
                                "--kv-cache-memory-mb)")
    # vLLM's meaning: F x the device's memory for this verifier; the KV cache gets what is left
    # after the weights, heads, step workspace and graphs (verifier_service/kv/budget.py)
    gpu_memory_utilization: float = option(
        0.0, "on an accelerator: the share of its memory this verifier uses, the KV cache "
        "taking what is left (0: size it by --kv-cache-memory-mb; ignored on a CPU)")
    # Full blocks of kept rows stay cached after their request, named by their whole prefix;
    # a prompt that starts the same way takes them instead of computing them again
    # (verifier_service/batching/prefix_cache.py). vLLM's flag.
    enable_prefix_caching: bool = option(
        True, "reuse the KV blocks of prompt prefixes computed before (LRU-evicted)")
    max_model_len: int = option(0, "context length limit (0: the model's own)")
    threads: int = option(0, "torch intra-op threads (0: $OMP_NUM_THREADS, which "
                          "`splitspec up` and the chart set per service, else torch's default)")
    # kernels/linear.py
    linear: str = option("auto", "matmul kernels of the model: dense (plain), onednn, fp16 "
                         "(FBGEMM) or fp16-dot (split over every thread; weights packed once); "
                         "auto picks one that suits this machine",
                         choices=("auto", "dense", "onednn", "fp16", "fp16-dot"))
    # vLLM's flag: the target's products on int8 weights, one fp32 scale per output column
    # (kernels/int8_dot.py), lossless with respect to the quantized model; CPU float32 only
    # (verifier_service/model/quantization.py)
    quantization: str = option("none", "weights of the target's products: none, or int8 "
                               "(weight-only, per output column: half the bytes a step reads, "
                               "the model's outputs change a little; CPU only)",
                               choices=("none", "int8"))
    # Which distribution a request's logprobs describe (vLLM's --logprobs-mode names):
    # processed_logprobs: the one each token was drawn from (logits processors, temperature with
    # greedy rows at 1, top-k/top-p/min-p); raw_logprobs: the model's own softmax.
    logprobs_mode: str = option("processed_logprobs",
                                "what logprobs report: processed_logprobs (the distribution "
                                "each token is drawn from) or raw_logprobs (the model's own)",
                                choices=("processed_logprobs", "raw_logprobs"))
    # Structured outputs (verifier_service/grammar/compiler.py): a request's grammar is compiled
    # off the step loop, within this limit, and kept in an LRU of this many grammars.
    grammar_compile_timeout_s: float = option(
        10.0, "seconds a structured output's grammar may take to compile; longer: the request "
        "is refused (INVALID_ARGUMENT)")
    grammar_cache_size: int = option(64, "compiled grammars kept for later requests (LRU)")
    chat_template: str = option(
        "", "the chat template of chat requests: a Jinja file, or a template shipped in "
        "splitspec/chat_templates by name (chatml_tools: ChatML showing tools in the Hermes "
        "format); default: the model's own, else the plain default (docs/api.md)")
    warmup: bool = option(True, "run one short generation before reporting SERVING")
    # On a device with graphs (CUDA, MLU), decode steps run in buckets of sequences x rows
    # (powers of two up to --max-num-seqs x (1 + --max-num-speculative-tokens)), each captured
    # once at start-up and replayed: verifier_service/step/executor.py; an EAGLE head's greedy
    # chain and advance too (verifier_service/methods/eagle/graphs.py).
    graphs: str = option("auto", "capture decode steps (and an EAGLE head's greedy drafting) "
                         "as device graphs (auto: where the device supports them)",
                         choices=("auto", "off"),
                         aliases=("--cuda-graphs",))
    # Tensor parallelism (verifier_service/tp/worker.py): the target's weights and KV heads
    # split over N devices, one process per device, started by the verifier itself.
    tensor_parallel_size: int = option(
        1, "devices the target is split over (tensor parallel; the KV head count must be a "
        "multiple); the verifier starts one process per device")
    tensor_parallel_nodes: int = option(
        1, "hosts the tensor-parallel ranks span, size / nodes ranks each (docs/deploy.md)")
    tensor_parallel_node_rank: int = option(
        0, "this host's place among --tensor-parallel-nodes (0: the host that serves gRPC)")
    tensor_parallel_address: str = option(
        "", "HOST:PORT where rank 0 meets the other ranks (default: a free local port)")
    # On SIGTERM: NOT_SERVING at once, new requests refused, running ones get this long to end.
    shutdown_grace_s: float = option(2.0, "seconds running requests may take to end on SIGTERM")
    log_level: str = option("INFO", "logging level")
