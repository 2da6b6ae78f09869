# splitspec: `make run` serves the stack locally, `make test` runs the suite.
# Both create/refresh the virtualenv in .venv first (idempotent: re-installs only when
# pyproject.toml or constraints.txt changed).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.stamp-install
PYTEST_ARGS ?=

.PHONY: setup run test protos bench bench-kernels bench-engine bench-spec models models-eval clean

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[test]'
	@touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(PY) -m splitspec.launcher up

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

protos: $(STAMP)
	PYTHON=$(PY) scripts/gen_protos.sh

bench-kernels: $(STAMP)
	$(PY) bench/kernels_bench.py

bench-engine: $(STAMP)
	$(PY) bench/engine_bench.py

bench-spec: $(STAMP)
	$(PY) bench/spec_bench.py

bench: bench-kernels bench-engine bench-spec

# Retrain the shipped model family (tokenizer, target, draft, MLP speculator) from the Python
# standard library, about 85 minutes on 2 cores, then re-measure the model card's figures.
models: $(STAMP)
	$(PY) scripts/train_models.py
	$(PY) scripts/eval_models.py

# Re-measure models/README.md's figures (held-out loss, acceptance per proposer and position).
models-eval: $(STAMP)
	$(PY) scripts/eval_models.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
