# Two entry points on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip

.PHONY: demo test lint bench bench-quick clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed pyproject.toml
	$(PIP) install -q -e '.[dev]'
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/lakebuffer demo

test: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q; rc=$$?; if [ $$rc -eq 5 ]; then echo 'pytest collected no tests' >&2; exit 1; fi; exit $$rc

bench: $(VENV)/.installed-dev
	$(VENV)/bin/lakebuffer bench --out benchmarks/results.json

bench-quick: $(VENV)/.installed-dev
	$(VENV)/bin/lakebuffer bench --quick --out /tmp/lakebuffer-bench-quick.json

clean:
	rm -rf $(VENV) build *.egg-info
