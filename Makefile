# Two commands for a fresh machine: `make train` (set up + train the default) and `make test`.
# `make mutation`: mutation testing of the core (slow, not part of `make test`; docs/testing.md).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup train test mutation

setup: $(VENV)/.installed

$(VENV)/.installed: requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $@

# Extra Hydra overrides: make train ARGS="trainer.max_steps=200 model.hidden_size=128"
train: setup
	$(PY) train.py $(ARGS)

# Formatting and lint first (seconds), then two workers: the tests that train run one at a time in one of them
# (tests/fixtures.py, docs/testing.md).
test: setup
	$(VENV)/bin/ruff format --check --quiet .
	$(VENV)/bin/ruff check --quiet .
	$(PY) -m pytest -q -n 2 --dist loadgroup

mutation: setup
	PY=$(PY) bash dev/mutation.sh
