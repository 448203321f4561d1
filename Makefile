# Two commands on a fresh machine (CPU):  `make train`  runs the main job,  `make test`  runs the tests.
# CUDA users: see README ("Install") instead of the CPU constraints used here.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed

.PHONY: setup train test lint clean

$(STAMP): pyproject.toml .ci/constraints-cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -c .ci/constraints-cpu.txt torch
	$(PY) -m pip install -q -c .ci/constraints-cpu.txt -e ".[examples,test,ray]"
	touch $(STAMP)

setup: $(STAMP)

train: $(STAMP)
	$(PY) examples/dqn_cartpole.py

test: $(STAMP)
	$(PY) -m ruff check objectrl_buffer tests examples benchmarks
	$(PY) -m mypy
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache
