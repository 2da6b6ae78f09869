"""Runs the target model over a packed ragged batch on the paged KV cache.

Each sequence contributes its uncached tokens plus its draft tokens (prefill, decode and
verification are the same operation); one forward covers the whole batch. Logits are computed
only for the rows that are verified: the last k+1 of each sequence.

`run_plan` is the forward over a step plan's arrays already on the device
(verifier_service/step/plan.py): what the step executor runs eagerly or captures into a graph,
so it reads nothing back to the host. `forward` plans and runs one step at its exact shape: the
direct, eager entry point.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from kernels.layout import StepLayout
from kernels.linear import pack_linears
from splitspec.lean_llama import LeanDecoder
from splitspec.tensor_parallel import check_shardable, release_weights, shard_decoder
from verifier_service.kv.cache import BlockTable, PagedKVCache
from verifier_service.kv.cpu_attention import CpuAttention
from verifier_service.kv.paged_attention import ATTENTION_NAME, PagedBatch, paged_attention_forward
from verifier_service.step.plan import StepPlan, plan_step


class ModelRunner:
    def __init__(self, model, device: torch.device, kv: PagedKVCache, linear: str = "auto",
                 max_model_len: int | None = None, tensor_parallel=None,
                 keep_whole: tuple[str, ...] = ()):
        """max_model_len: the longest context served (default: the model's own); RoPE tables
        and a bucket's block tables are sized for it. tensor_parallel: this process's rank of a
        group (splitspec/tensor_parallel.py) to shard the lean forward over; `kv` then holds
        this rank's KV heads, and `model` may sit anywhere (its weights are released once
        sharded onto `device`). keep_whole: under tensor parallelism, the vocabulary tables
        ("embed", "head") this rank keeps whole on `device` beside its shards, for a head that
        drafts here alone (an EAGLE head on rank 0: take_vocab_tables)."""
        if model.config._attn_implementation != ATTENTION_NAME:
            raise ValueError(f"load the model with attn_implementation={ATTENTION_NAME!r}")
        self.memory_budget = None  # --gpu-memory-utilization's split (model/memory.py)
        self.model = model
        self.device = device
        self.kv = kv
        self.config = model.config
        # Decoder and LM head separately: logits only for the verified rows, and the final
        # hidden state for proposers that condition on it. (Llama-family heads: no logit
        # soft-capping or scaling after the head.)
        self._decoder = model.get_decoder()
        self.hidden_size = model.config.hidden_size
        self.max_model_len = int(max_model_len or getattr(model.config,
                                                          "max_position_embeddings", 2048))
        # paged attention of bucket steps (kernels/paged_attention.py): "auto" runs Triton on
        # accelerators; the step executor may pin it
        self.attention_kernel = "auto"
        # the target's features every step hands to heads on them (in-target methods such as
        # EAGLE): None, none; () the final-norm hidden state of every fed row; else the
        # residual-stream inputs of these layers, side by side (set by the method at start-up)
        self.feature_layers: tuple[int, ...] | None = None
        # Llama-family models run as plain tensor ops (splitspec/lean_llama.py) with the same
        # paged attention function: the transformers forward's per-call machinery is ~10% of a
        # batch-1 step of a small model. Other architectures keep the transformers forward.
        # `linear` picks the matmul kernels (kernels/linear.py): packed once, batch invariant.
        tp = tensor_parallel if tensor_parallel is not None and tensor_parallel.size > 1 else None
        self.tensor_parallel_size = tp.size if tp is not None else 1
        self._lean = (LeanDecoder(model, "dense" if tp else linear,
                                  max_positions=self.max_model_len)
                      if LeanDecoder.supports(model) else None)
        self._whole: dict[str, torch.Tensor] = {}
        if tp is not None:
            check_shardable(model.config, tp.size)  # the lean forward, whole KV heads per rank
            self._whole = _whole_tables(self._lean, keep_whole, device)
            shard_decoder(self._lean, tp, linear)
            release_weights(model)
        elif self._lean is not None:
            # packed products hold their own copies: the layers' float32 weights go (on the
            # real model on a CPU, ~400 MiB of a verifier's ~1.5 GiB)
            self._lean.release_dense(model)
        if self._lean is not None:
            self._head, self.linear = self._lean.head, self._lean.linear
        else:
            self.linear = pack_linears(model, linear)
            self._head = model.get_output_embeddings()
        self.vocab_size = getattr(self._head, "vocab_size", None) or self._head.weight.shape[0]
        self._layer_refs = [SimpleNamespace(layer_idx=i)
                            for i in range(model.config.num_hidden_layers)]

    def take_vocab_tables(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The target's whole token embedding and output head weight ([V, H] each, on the
        device), for a head drafting in this process: the lean forward's own, or, when they are
        sharded over tensor-parallel ranks, the copies kept at load (keep_whole), handed over
        (the runner lets go of them: what the taker drops is freed); None for one not kept."""
        if self.tensor_parallel_size > 1:
            whole, self._whole = self._whole, {}
            return whole.get("embed"), whole.get("head")
        if self._lean is None:
            return None, None
        return self._lean.embed, self._lean.head.weight

    @property
    def lean(self) -> bool:
        """Whether the target runs the lean forward (the one a step executor captures)."""
        return self._lean is not None

    def forward(self, input_ids: list[int], tables: list[BlockTable], layout: StepLayout
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward over the packed step: input_ids [T_in] laid out as `layout` says, each
        sequence's table already holding slots for start_pos + query_len positions.
        Returns float32 logits [T_out, V] at layout.logits_indices, and the final hidden states
        [T_out, H] they came from (after the final norm: what hidden-state proposers read)."""
        plan = plan_step(layout, input_ids, [t.blocks for t in tables], self.kv.block_size,
                         self.kv.trash_block)
        return self.run_plan(plan.fields.views(plan.host.to(self.device)), plan)

    @torch.inference_mode()
    def run_plan(self, views: dict[str, torch.Tensor], plan: StepPlan, out: dict | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """The forward over a plan whose arrays (`views`) are on the device: float32 logits
        [L, V] of its logits rows and their final hidden states [L, H]. Reads only device
        tensors and the plan's shape. With `feature_layers` set and an `out` dict given,
        out["features"] is every fed row's features [T, F] (see feature_layers)."""
        # the lean forward on a CPU: RoPE, the cache write and attention in two kernel calls a
        # layer (verifier_service/kv/cpu_attention.py); else the paged attention function
        cpu = (CpuAttention.for_plan(plan, views, self.kv.block_size, self.kv.k)
               if self._lean is not None else None)
        batch = None if cpu is not None else PagedBatch.from_plan(
            self.kv.k, self.kv.v, views, plan, self.kv.block_size, self.attention_kernel)
        ids = views["ids"][None]  # [1, T]
        positions = views["positions"][None]  # [1, T]: a tree node sits at its depth
        if self._lean is not None:
            lean, refs, kv = self._lean, self._layer_refs, self.kv

            def attend(i, q, k, v):  # q [1, Hq, T, D], k/v [1, H_kv, T, D] -> [1, T, Hq * D]
                out, _ = paged_attention_forward(refs[i], q, k, v, None, lean.scale, paged=batch)
                return out.reshape(1, out.shape[1], -1)

            def attend_qkv(i, qkv, rope):  # qkv [T, (Hq + 2 H_kv) D] -> [T, Hq * D]
                return cpu(qkv, rope, kv.k[i], kv.v[i], lean.n_heads, lean.n_kv, lean.scale)

            layers = self.feature_layers if out is not None else None
            captured: list[torch.Tensor] = []
            states = lean.hidden(ids, positions, attend, capture=layers or (),
                                 captured=captured,
                                 attend_qkv=attend_qkv if cpu is not None else None)[0]  # [T, H]
            if layers is not None:
                out["features"] = torch.cat(captured, -1) if layers else states
        else:
            states = self._decoder(input_ids=ids, position_ids=positions, use_cache=False,
                                   paged=batch).last_hidden_state[0]
        hidden = states.index_select(0, views["logits_rows"])  # [L, H]
        return self._head(hidden).float(), hidden


def _whole_tables(lean, names: tuple[str, ...], device: torch.device) -> dict[str, torch.Tensor]:
    """Copies of the named vocabulary tables of a lean forward not yet sharded, on `device`
    (a tied head shares the embedding's copy)."""
    out: dict[str, torch.Tensor] = {}
    if "embed" in names:
        out["embed"] = lean.embed.detach().to(device, copy=True)
    if "head" in names:
        weight = lean.head.weight
        tied = "embed" in out and weight.data_ptr() == lean.embed.data_ptr()
        out["head"] = out["embed"] if tied else weight.detach().to(device, copy=True)
    return out
