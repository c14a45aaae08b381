# Two commands on a fresh machine with only Python 3.11 and the package registries:
#   make demo   set up .venv with what the demo needs and diagnose the shipped data-starved example
#   make test   set up .venv with everything and run lint, type checks and the whole test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# uv installs what pip would, in half the time; compiled to bytecode at install, as
# pip does (where PYTHONDONTWRITEBYTECODE is set, nothing else ever compiles it)
PIP    := $(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python -c constraints-dev.txt
# uv reads no pip configuration: the wheels pip is told to find (the CPU build of torch) it finds
# too (pip's list is separated by spaces, uv's by commas)
empty :=
comma := ,
ifdef PIP_FIND_LINKS
export UV_FIND_LINKS ?= $(subst $(empty) $(empty),$(comma),$(strip $(PIP_FIND_LINKS)))
endif
# the demo needs the package and torch; the tests add TensorFlow and the dev tools
DEMO_STAMP := $(VENV)/.installed-demo
TEST_STAMP := $(VENV)/.installed-test

.PHONY: demo test lint typecheck pytest test-fast bench clean system-packages

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(BIN)/uv: | $(VENV)/bin/python
	$(BIN)/python -m pip install -q uv

$(DEMO_STAMP): pyproject.toml constraints-dev.txt | $(BIN)/uv
	$(PIP) -e '.[torch]'
	touch $@

$(TEST_STAMP): pyproject.toml constraints-dev.txt | $(BIN)/uv
	$(PIP) -e '.[torch,dev]' tensorflow-cpu
	touch $@ $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/loadprof diagnose --json demo-run.json examples/torch_starved.py
	@echo
	@echo "Now the fixed version:"
	$(BIN)/loadprof diagnose examples/torch_fixed.py

lint: $(TEST_STAMP)
	$(BIN)/ruff check profiler converters tests examples benchmarks

# mypy cannot map a folder to another package name: check a tree of links named as installed.
typecheck: $(TEST_STAMP)
	rm -rf build/typecheck && mkdir -p build/typecheck/loadprof
	for f in profiler/*; do ln -s "$(CURDIR)/$$f" build/typecheck/loadprof/; done
	ln -s "$(CURDIR)/converters" build/typecheck/loadprof/converters
	$(BIN)/mypy

# programs some tests drive from outside (chromium, tmux): installed when missing, never fatal
system-packages:
	-.ci/system-packages

# two tiers: tests/unit (no processes, no sleeps, no real clocks) and tests/integration
# (real loops, torchrun, Chromium, tmux); two test processes keep both cores busy
pytest: $(TEST_STAMP) system-packages
	$(BIN)/python -m pytest -q -ra -n 2 --dist worksteal

# for iteration: lint, types and the unit tier (CI runs the whole suite)
test-fast: lint typecheck
	$(BIN)/python -m pytest -q -ra tests/unit

test: lint typecheck pytest

bench: $(DEMO_STAMP)
	$(BIN)/python benchmarks/overhead.py

clean:
	rm -rf $(VENV) build *.egg-info demo-run.json
