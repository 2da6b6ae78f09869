"""The paged KV cache: fixed-size blocks, the allocator (with the prefix cache's reference
counts and LRU queue) and per-sequence block tables (cache.py), the keys that name a full
block's prefix (prefix.py), the record of cache operations other tensor-parallel ranks replay
(journal.py), and the attention over the cache plugged into transformers (paged_attention.py).

Imports nothing of the verifier (kernels/ for the attention's tensor math); imported by
batching/ (a sequence's block table), model/ and tp/.
"""
