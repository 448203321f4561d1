# Two commands on a fresh machine (CPU):  `make train`  runs the main job,  `make test`  runs the tests.
# torch: the CPU build from PyTorch's CPU index when it is reachable, else the pin from the configured
# indexes (.ci/torch_index.py explains TORCH_INDEX: `make TORCH_INDEX= setup` forces the plain pin,
# `make TORCH_INDEX=https://download.pytorch.org/whl/cu126 setup` a CUDA build). See README ("Install").
PYTHON      ?= python3
VENV        ?= .venv
TORCH_INDEX ?= auto
PY           = $(VENV)/bin/python
STAMP        = $(VENV)/.installed
RAY_STAMP    = $(VENV)/.installed-ray
DOCS_STAMP   = $(VENV)/.installed-docs
# compat: a .pth path entry that mypy, Pylance and other type checkers follow (the default editable
# mode installs an import hook that only the interpreter sees)
EDITABLE     = --config-settings editable_mode=compat

.PHONY: setup train test test-all lint clean docs

$(STAMP): pyproject.toml .ci/constraints-cpu.txt .ci/torch_index.py
	$(PYTHON) -m venv $(VENV)
	args="$$(TORCH_INDEX='$(TORCH_INDEX)' $(PYTHON) .ci/torch_index.py)" && \
	echo "$(PY) -m pip install $$args torch" && \
	$(PY) -m pip install $$args torch
	$(PY) -m pip install -q -c .ci/constraints-cpu.txt $(EDITABLE) -e ".[examples,test]"
	touch $(STAMP)

# The tests also run the Ray-served buffer: the optional `ray` extra, installed for `make test` only.
$(RAY_STAMP): $(STAMP)
	$(PY) -m pip install -q -c .ci/constraints-cpu.txt "ray>=2.40"
	touch $(RAY_STAMP)

# The documentation site (Sphinx, MyST, furo): the optional `docs` extra, installed for `make docs` and `make test`
# (tests/docs builds the site and runs every code block of the README and the docs).
$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install -q -c .ci/constraints-cpu.txt $(EDITABLE) -e ".[docs]"
	touch $(DOCS_STAMP)

setup: $(STAMP)

# The main job (seed 1; the same numbers on every run on CPU: examples/dqn_cartpole.py, "Reproducible"). It
# (re)writes what the README shows, docs/dqn_cartpole.json + .png, and first, in seconds, the short reference
# tests/test_main_job.py compares a re-run with, docs/dqn_cartpole_short.json. Commit all three after a change.
train: $(STAMP)
	$(PY) examples/dqn_cartpole.py --short-reference docs/dqn_cartpole_short.json
	$(PY) examples/dqn_cartpole.py --plot docs/dqn_cartpole.png --summary docs/dqn_cartpole.json

# The site into docs/_build/html, rebuilt whole (-E: every warning shown each time); warnings are errors
# (tests/docs/test_site.py builds with the same options).
docs: $(DOCS_STAMP)
	$(PY) -m sphinx -E -W --keep-going -b html docs docs/_build/html

# pytest in two worker processes (pytest-xdist), a test file per worker at a time (--dist loadfile: a file's
# module fixtures, e.g. its Ray session, start once): much of the suite waits on child processes, Ray and the
# browser, so two workers on two cores take ~40% less wall time than one; each test still runs alone in its file.
PYTEST_ARGS ?= -q -n 2 --dist loadfile

test: $(RAY_STAMP) $(DOCS_STAMP)
	$(PY) -m ruff check objectrl_buffer tests examples benchmarks
	$(PY) -m mypy
	$(PY) -m pytest $(PYTEST_ARGS)

# everything `make test` runs, plus the slow and soak cases (@pytest.mark.slow, run when RUN_SLOW=1)
test-all: $(RAY_STAMP) $(DOCS_STAMP)
	$(PY) -m ruff check objectrl_buffer tests examples benchmarks
	$(PY) -m mypy
	RUN_SLOW=1 $(PY) -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache docs/_build
