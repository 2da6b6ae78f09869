"""The verifier service: the target model, its paged KV cache, continuous batching and the
rejection sampler; it turns proposers' guesses into tokens distributed exactly as the target's.

A folder per concern, bottom up (each folder's __init__.py says what it owns and may import;
tests/import_graph.py holds these directions and `make lint` fails on an import against them):

    kv/         the paged KV cache (blocks, tables, the TP journal) and attention over it
    telemetry/  the engine's stats (plain dataclasses) and their exporters: metrics, traces
    batching/   a request inside the verifier, its output tracking, the continuous-batching
                scheduler
    methods/    in-target methods: the interface (in_target.py), lookahead, eagle/
    step/       one engine step: plan, executor, samplers, verification, warm-up
    model/      the target on this process's device: loading it, running it over the cache
    drafts/     where a step's drafts come from: proposer clients and pools over gRPC, the
                collector that checks every draft, drafting ahead, the per-step k
    tp/         tensor parallelism: the one broadcast per step, the other ranks' loop
    grammar/    structured outputs: grammars compiled against the tokenizer and cached, one
                matcher per request walked over each step's drafts, forbidden drafts pruned

At the top: the one config object (config.py, importable from any folder that names it) and its
checks, the engine that ties the folders into a step loop (engine.py), the gRPC edge
(servicer.py, prompt.py: the Verifier API's protobuf converted there; the Propose stream's
in drafts/client.py) and the process (server.py). Nothing in a folder imports the top but config.py.
"""
