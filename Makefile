# Every target builds its own virtual environment from nothing (python3 >= 3.11).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

## demo: AMPD vs plain PD disaggregation on a real trace and a ToolBench-like workload
demo: $(STAMP)
	$(VENV)/bin/ampd sweep --config configs/demo.toml --out out/demo

## test: the whole test suite
test: $(STAMP)
	$(PY) -m pytest

## bench: every benchmark; figures in bench/results/<name>.json
bench: $(STAMP)
	for b in bench/bench_*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) out
