"""Pure tensor functions for speculative decoding: sampling, rejection sampling, typical acceptance,
n-gram matching. PyTorch references everywhere; Triton kernels are imported lazily, only on
CUDA / MLU at call time, so importing this package needs neither triton nor a GPU."""

from kernels.ngram import ngram_candidates
from kernels.rejection import (
    PLACEHOLDER_TOKEN_ID,
    RaggedLayout,
    RejectionResult,
    SparseProbs,
    rejection_sample,
    typical_acceptance_sample,
)
from kernels.sampling import SamplingTensors, apply_sampling_params, sample

__all__ = [
    "PLACEHOLDER_TOKEN_ID",
    "RaggedLayout",
    "RejectionResult",
    "SamplingTensors",
    "SparseProbs",
    "apply_sampling_params",
    "ngram_candidates",
    "rejection_sample",
    "sample",
    "typical_acceptance_sample",
]
