"""The proposer service: one speculation method's drafts per process, streamed to verifiers.

At the top: what every proposer implements (base.py), its config (config.py), the small
proposers that need no model (ngram.py, suffix.py), the tree selection they share with the
learned ones (tree_builder.py), how a learned proposer samples its tokens and the q it sends
(sampling.py), drafting ahead (ahead.py), the gRPC edge (servicer.py) and the process
(server.py). A folder per model-backed drafter, and telemetry:

    draft/      a draft model of its own, with its KV cache per sequence, captured loops and
                tensor parallelism
    mlp/        the MLP speculator on the target's hidden state and its checkpoint format
    telemetry/  metrics, traces and the two wired together for the server

A drafter's folder imports only the top's shared modules (base, config, sampling,
tree_builder), never another drafter's; telemetry/ imports nothing of the service
(tests/import_graph.py holds these directions; `make lint` runs it).
"""
