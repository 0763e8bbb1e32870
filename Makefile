# Two entry points on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip

.PHONY: demo test test-slow wheel-check test-integration lint bench bench-quick clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed pyproject.toml
	$(PIP) install -q -c constraints.txt -e '.[dev]'
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/lakebuffer demo

# two pytest workers (pytest-xdist), a test file per worker at a time (its module fixtures, a Ray
# start, stay in one process): CI's 2 cores, 8:03 -> 5:14 here. TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
test: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q --durations=15 -n $(TEST_WORKERS) --dist loadfile --ignore=tests/integration -m 'not slow'; rc=$$?; if [ $$rc -eq 5 ]; then echo 'pytest collected no tests' >&2; exit 1; fi; exit $$rc

# the long suites (marked `slow`): full-size kill loops, memory runs and exit-safety loops. CI runs both.
test-slow: $(VENV)/.installed-dev
	$(PY) -m pytest -q --durations=15 --ignore=tests/integration -m slow; rc=$$?; if [ $$rc -eq 5 ]; then echo 'pytest collected no slow tests' >&2; exit 1; fi; exit $$rc

# the built wheel, installed non-editable in a fresh venv, run from outside the checkout
wheel-check: $(VENV)/.installed
	PYTHON=$(PY) .ci/wheel-check

# torch (CPU, from the local wheel), verl (without its GPU stack), tensordict and the imports of verl's
# trainer (hydra, torchdata, ...): the verl adapter, the verl replay hook and the torch DataLoader tests.
# Ray is in .[dev] already, so the Ray tests also run in `make test`. CI (.ci/run) runs this after `make test`.
$(VENV)/.installed-integration: $(VENV)/.installed-dev requirements-integration.txt
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -c constraints.txt -r requirements-integration.txt
	$(PIP) install -q --no-deps verl==0.9.1
	touch $@

test-integration: $(VENV)/.installed-integration
	$(PY) -m pytest -q tests/test_dataset.py tests/test_honest_output.py::test_grpo_example_leaves_no_temp_data tests/integration

# the bench extra: torch (the CPU wheel, pinned first so no CUDA build is pulled) and torchrl for the TorchRL baseline
$(VENV)/.installed-bench: $(VENV)/.installed-dev pyproject.toml
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -c constraints.txt -e '.[bench]'
	$(PIP) install -q --no-deps torchrl==0.14.1  # its tensordict < 0.15 bound would break TransferQueue (pyproject.toml)
	touch $@

bench: $(VENV)/.installed-bench
	$(VENV)/bin/lakebuffer bench --out benchmarks/results.json

bench-quick: $(VENV)/.installed-bench
	$(VENV)/bin/lakebuffer bench --quick --out /tmp/lakebuffer-bench-quick.json

clean:
	rm -rf $(VENV) build *.egg-info
