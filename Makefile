# Two commands do all set-up on a fresh machine:
#   make train   - a whole federated training (default_credit, embedded default)
#   make test    - the test suite
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: train test test-all bench compose-test

# strict: setuptools links the checkout's files into build/__editable__.*/ (symlinks: edits
# show at once) and puts that folder on sys.path, so 'import fedboost' finds the package even
# beside a folder named fedboost (a clone), which the default (lenient) editable finder loses
# to; 'compat' did the same but is deprecated. A module added later is seen from the checkout
# at once (Python looks in the current folder first) and from elsewhere after
# 'make -B .venv/.installed'; removing build/ needs that too. The filter drops only
# setuptools' notice saying so ("Editable installation. ... auxiliary directory"): its
# deprecations and errors still show.
$(VENV)/.installed: pyproject.toml setup.py crypto/_bin_products.c Makefile
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	PYTHONWARNINGS="ignore:Editable installation.:UserWarning" \
	  $(PY) -m pip install -q -e '.[test]' --config-settings editable_mode=strict
	touch $@

train: $(VENV)/.installed
	$(VENV)/bin/fedboost train configs/default_credit.yaml --out runs/default-credit

# two test files at a time (each file's tests in one process, so a file's federation fixture is
# built once): most of a test's wall time waits on other processes (workers, Prefect, the broker);
# then, alone, the few tests marked 'serial' (one stops the broker every other test uses)
test: $(VENV)/.installed
	status=0; \
	$(PY) -m pytest -m "not heavy and not serial" -n 2 --dist loadfile || status=$$?; \
	$(PY) -m pytest -m "serial and not heavy" || status=$$?; \
	exit $$status

# everything, with the quality benchmarks and the longest drills (about 10 minutes more)
test-all: $(VENV)/.installed
	$(PY) -m pytest

# docker compose for real (docs/operations.md, "docker compose"): build, start, train, kill a worker,
# the Prefect UI in headless Chromium, tear down; 15-25 minutes, not in CI (make test)
compose-test: $(VENV)/.installed
	PATH="$(abspath $(VENV))/bin:$$PATH" deploy/compose-smoke.sh

bench: $(VENV)/.installed
	$(PY) -m benchmarks.train
