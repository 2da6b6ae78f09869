"""Pure tensor functions for speculative decoding: the step layout, sampling, rejection sampling
of draft chains and trees, n-gram matching. PyTorch references everywhere;
Triton kernels are imported lazily, only on CUDA / MLU at call time, so importing this package
needs neither triton nor a GPU."""

from kernels.layout import PLACEHOLDER_TOKEN_ID, RejectionResult, StepLayout
from kernels.ngram import ngram_candidates
from kernels.rejection import rejection_sample
from kernels.sampling import SamplingTensors, apply_sampling_params, noise_key, sample
from kernels.sparse_probs import SparseProbs
from kernels.tree_rejection import TreeResult, tree_rejection_sample

__all__ = [
    "PLACEHOLDER_TOKEN_ID",
    "RejectionResult",
    "SamplingTensors",
    "SparseProbs",
    "StepLayout",
    "TreeResult",
    "apply_sampling_params",
    "ngram_candidates",
    "noise_key",
    "rejection_sample",
    "sample",
    "tree_rejection_sample",
]
