# Two commands on a fresh machine with only Python 3.11 and the package registries:
#   make demo   set up .venv and diagnose the shipped data-starved example
#   make test   set up .venv and run lint, type checks and the whole test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint typecheck pytest bench clean

$(STAMP): pyproject.toml constraints-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints-dev.txt -e '.[torch,dev]' tensorflow-cpu
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/loadprof diagnose --json demo-run.json examples/torch_starved.py
	@echo
	@echo "Now the fixed version:"
	$(BIN)/loadprof diagnose examples/torch_fixed.py

lint: $(STAMP)
	$(BIN)/ruff check profiler converters tests examples benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/python -m pytest -q -ra

test: lint typecheck pytest

bench: $(STAMP)
	$(BIN)/python benchmarks/overhead.py

clean:
	rm -rf $(VENV) build *.egg-info demo-run.json
