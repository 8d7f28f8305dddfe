# The README's two commands: `make demo` (set up + the main job) and `make test` (set up + lint + tests).
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
VENV ?= .venv
PYTHON ?= python3
# pip prints one "Location ... is ignored" line per package for this machine's local indexes; hide them.
QUIET_PIP := { grep -v "^WARNING: Location" || true; }

# constraints.txt: the exact version of every package the README's numbers come from (Python 3.11, Linux x86-64);
# `make lock` rewrites it; `make demo CONSTRAINTS=` installs pyproject's ranges unpinned instead
LOCK_FILE := constraints.txt
CONSTRAINTS ?= $(LOCK_FILE)
LOCK_VENV := .lock-venv

.PHONY: demo test test-faults test-slow test-stops test-cluster test-bench lint bench lock cluster-up cluster-down cluster-status clean

$(VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check $(if $(CONSTRAINTS),-c $(CONSTRAINTS)) -e '.[test]' 2>&1 \
		| $(QUIET_PIP)
	touch $@

# resolve pyproject's ranges afresh in a scratch venv and pin what it got (then run `make demo` from a clean clone
# and update the README's demo table)
lock:
	rm -rf $(LOCK_VENV)
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install -q --disable-pip-version-check -e '.[test]' 2>&1 | $(QUIET_PIP)
	{ echo "# make lock: every package of \`pip install -e '.[test]'\` at its exact version, ropim itself left out;"; \
	  echo "# made with $$($(LOCK_VENV)/bin/python -V) on $$(uname -sm). make demo / make test install with -c $(LOCK_FILE)."; \
	  $(LOCK_VENV)/bin/pip list --format=freeze --exclude-editable --exclude pip --exclude setuptools --exclude wheel \
	    --disable-pip-version-check 2>/dev/null; } > $(LOCK_FILE)
	rm -rf $(LOCK_VENV)

demo: $(VENV)/.installed
	$(VENV)/bin/ropim demo

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/python scripts/check_layout.py
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet --site-dir site

test: lint
	$(VENV)/bin/pytest

# faults put on running jobs (marker `faults`: SIGTERM, SIGKILL, a Ray worker's death, a sweep stopped and resumed,
# a busy core, three jobs started at once on one store), on the one Ray session of `make test`, which leaves them out
test-faults: $(VENV)/.installed
	$(VENV)/bin/pytest -m faults

# whole jobs end to end that make test covers by smaller runs (marker `slow`): sweeps whose trials fine-tune or
# segment, two Ray workers through a linked folder, segmentation on Ray and its registered segmenter, the installed wheel,
# a paper preset refusing a digits champion, a transfer table over two encoders, ropim viz in a fresh process
test-slow: $(VENV)/.installed
	$(VENV)/bin/pytest -m slow

# a stop signal at 6 seeded moments of a Ray pretraining, start-up to registration (marker `stops`; CI runs it after
# the faults; ROPIM_STOPS_SEED=N make test-stops stops it at other moments)
test-stops: $(VENV)/.installed
	$(VENV)/bin/pytest -m stops

# the cluster tests (marker `cluster`, most in tests/cluster): an S3 server, MLflow servers, a Ray cluster of a head
# and two worker nodes, `make cluster-up`'s locked-down head + MLflow server, the local cluster `ropim` starts, all on
# this machine; `make test` leaves them out
test-cluster: $(VENV)/.installed
	$(VENV)/bin/pytest -m cluster

# the benchmarks end to end at their --tiny sizes (marker `bench`): bench/gpu_window.sh --tiny, as on a GPU machine's
# image without Ray or MLflow
test-bench: $(VENV)/.installed
	$(VENV)/bin/pytest -m bench

bench: $(VENV)/.installed
	$(VENV)/bin/python bench/rop_overhead.py

# a Ray head + an MLflow server on 127.0.0.1 for `ray job submit` (ropim/cluster: ports and folders from the
# environment, e.g. MLFLOW_PORT=5002 make cluster-up)
cluster-up: $(VENV)/.installed
	$(VENV)/bin/python -m ropim.cluster up

cluster-down:
	$(VENV)/bin/python -m ropim.cluster down

cluster-status:
	$(VENV)/bin/python -m ropim.cluster status

clean:
	rm -rf $(VENV) $(LOCK_VENV) *.egg-info .pytest_cache .ruff_cache
