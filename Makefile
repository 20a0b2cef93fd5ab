# Two commands do all set-up on a fresh machine:
#   make train   - a whole federated training (default_credit, embedded default)
#   make test    - the test suite
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: train test test-all bench compose-test compose-orgs-test

# An editable install, and the checkout itself on sys.path (fedboost-checkout.pth), so that
# 'import fedboost' finds the package even beside a folder named fedboost (a clone), which
# setuptools' default editable finder loses to (the notice it prints about that, "Editable
# installation. ... folders in your working directory with the same name", is what the .pth
# answers, so it alone is filtered: setuptools' deprecations and errors still show). This is
# what the deprecated editable_mode=compat did; 'strict' would too, but sees a module added
# later only after a reinstall.
$(VENV)/.installed: pyproject.toml setup.py crypto/_bin_products.c Makefile
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	PYTHONWARNINGS="ignore:Editable installation.:UserWarning" $(PY) -m pip install -q -e '.[test]'
	echo "$(CURDIR)" > "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/fedboost-checkout.pth"
	touch $@

train: $(VENV)/.installed
	$(VENV)/bin/fedboost train configs/default_credit.yaml --out runs/default-credit

# three test files at a time (each file's tests in one process, so a file's federation fixture is
# built once): most of a test's wall time waits on other processes (workers, Prefect, the broker);
# then, alone, the few tests marked 'serial' (one stops the broker every other test uses); ruff's
# lint and mypy's type check (pyproject.toml's rules) first, a failure failing the target too
test: $(VENV)/.installed
	status=0; \
	$(PY) -m ruff check . || status=$$?; \
	$(PY) -m mypy || status=$$?; \
	$(PY) -m pytest -m "not heavy and not serial" -n 3 --dist loadfile || status=$$?; \
	$(PY) -m pytest -m "serial and not heavy" || status=$$?; \
	exit $$status

# everything, with the quality benchmarks and the longest drills (about 10 minutes more)
test-all: $(VENV)/.installed
	$(PY) -m pytest

# docker compose for real (docs/operations.md, "docker compose"): build, start, train, kill a worker,
# the Prefect UI in headless Chromium, tear down; 15-25 minutes, not in CI (make test)
compose-test: $(VENV)/.installed
	PATH="$(abspath $(VENV))/bin:$$PATH" deploy/compose-smoke.sh

# two organisations, each from its 'fedboost provision' kit and compose project: brokers joined by
# shovels over TLS, PostgreSQL under the lender's Prefect server (about 10 minutes, not in CI)
compose-orgs-test: $(VENV)/.installed
	PATH="$(abspath $(VENV))/bin:$$PATH" deploy/compose-orgs-smoke.sh

bench: $(VENV)/.installed
	$(PY) -m benchmarks.train
