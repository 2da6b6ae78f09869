"""How many KV cache blocks `--gpu-memory-utilization F` gives (vLLM's name and meaning).

The verifier may use F x the device's total memory. Out of it come, in this order, the target's
weights (measured: what the device holds once they are loaded), the in-target heads (an EAGLE
head: its tensors' bytes from its config), the step's workspace (the activations of the largest
forward a step runs, and the sampler's probabilities over the vocabulary for every row a step
may verify) and the captured graphs' memory pool (the activations of the largest bucket, which
every graph of the ladder shares, plus a small fixed cost per graph). What is left is the KV
cache: whole blocks of KVCacheSpec.bytes_per_token x block_size bytes. The workspace and the
graphs are budgeted from the shapes before anything runs (the cache must exist before the
graphs, which read its addresses), and the warm-up logs what the graphs measured beside their
budget (verifier_service/model/memory.py).

Start-up refuses, in one line naming the flags, a budget that cannot hold one sequence of the
context length served (--max-model-len), or an F above what the device has free at start (memory
another process holds is not this verifier's to take). These are pure functions of numbers:
tests/verifier_service/test_kv_budget.py checks them without a device.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1 << 30
GRAPH_OVERHEAD_BYTES = 2 << 20  # per captured graph: its kernels' parameters, the pool's slack


@dataclass(frozen=True)
class MemoryBudget:
    total_bytes: int  # the device's memory
    free_bytes: int  # free on it at start (before this process loaded anything)
    utilization: float  # F
    weights_bytes: int  # the target's weights, measured after loading
    heads_bytes: int = 0  # in-target heads (EAGLE) loaded after the cache
    workspace_bytes: int = 0  # the step's activations and the sampler's probabilities
    graphs_bytes: int = 0  # the captured graphs' pool

    @property
    def usable_bytes(self) -> int:
        return int(self.utilization * self.total_bytes)

    @property
    def kv_bytes(self) -> int:
        """What is left for the KV cache (negative: the rest does not fit)."""
        return (self.usable_bytes - self.weights_bytes - self.heads_bytes
                - self.workspace_bytes - self.graphs_bytes)

    def describe(self) -> str:
        return (f"{self.utilization:g} x {self.total_bytes / GIB:.1f} GiB = "
                f"{self.usable_bytes / GIB:.2f} GiB: weights {self.weights_bytes / GIB:.2f}, "
                f"heads {self.heads_bytes / GIB:.2f}, workspace "
                f"{self.workspace_bytes / GIB:.2f}, graphs {self.graphs_bytes / GIB:.2f}, "
                f"KV cache {self.kv_bytes / GIB:.2f} GiB")


def kv_blocks(budget: MemoryBudget, block_bytes: int) -> int:
    """Whole KV blocks in what the budget leaves (0 when nothing is left)."""
    return max(0, budget.kv_bytes) // block_bytes


def fit_problem(budget: MemoryBudget, block_bytes: int, block_size: int,
                max_model_len: int) -> str | None:
    """One line saying why the budget cannot serve (None: it can): F asks for more than the
    device has free, or what is left cannot hold one sequence of max_model_len tokens."""
    if not 0.0 < budget.utilization <= 1.0:
        return f"--gpu-memory-utilization {budget.utilization:g} must be in (0, 1]"
    taken = budget.total_bytes - budget.free_bytes
    if budget.usable_bytes > budget.free_bytes:
        return (f"--gpu-memory-utilization {budget.utilization:g} asks for "
                f"{budget.usable_bytes / GIB:.2f} GiB but the device has "
                f"{budget.free_bytes / GIB:.2f} GiB free ({taken / GIB:.2f} GiB held by others): "
                "lower it")
    need = -(-max_model_len // block_size)
    got = kv_blocks(budget, block_bytes)
    if got < need:
        return (f"the model does not fit: {budget.describe()}, {got} KV blocks of {block_size} "
                f"tokens where one sequence of --max-model-len {max_model_len} needs {need}; "
                "raise --gpu-memory-utilization or lower --max-model-len")
    return None


def step_workspace_bytes(tokens: int, rows: int, hidden: int, intermediate: int, vocab: int,
                         itemsize: int) -> int:
    """Peak activations of one forward over `tokens` fed tokens (a prefill chunk: residual,
    normed input, q/k/v, attention output, the MLP's gate and up and their product) plus the
    float32 logits, probabilities and residuals of `rows` rows the sampler scores (four
    [rows, vocab] float32 tensors at once: logits, p, q and the residual)."""
    per_token = (6 * hidden + 3 * intermediate) * itemsize
    return tokens * per_token + 4 * rows * vocab * 4


def graphs_bytes(max_bucket_rows: int, num_graphs: int, hidden: int, intermediate: int,
                 vocab: int, itemsize: int) -> int:
    """The graphs' shared pool: the largest bucket's activations (captured first, the others
    reuse its memory) and a fixed cost per graph; none when nothing is captured."""
    if num_graphs == 0:
        return 0
    return (step_workspace_bytes(max_bucket_rows, max_bucket_rows, hidden, intermediate, vocab,
                                 itemsize) + num_graphs * GRAPH_OVERHEAD_BYTES)
