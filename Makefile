# Two commands on a fresh machine with only Python 3.11 and the package registries:
#   make demo   set up .venv with what the demo needs and diagnose the shipped data-starved example
#   make test   set up .venv with everything and run lint, type checks and the whole test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# uv installs what pip would, in half the time
# torchvision kept out (excludes-dev.txt): litdata pulls it, and its wheel does not load against the
# CPU torch pinned here ("operator torchvision::nms does not exist"), breaking transformers and lightning
PIP    := $(BIN)/uv pip install -q --python $(BIN)/python -c constraints-dev.txt --excludes excludes-dev.txt
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

.PHONY: demo test lint typecheck warm warm-torch warm-tensorflow pytest test-fast bench clean system-packages

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(BIN)/uv: | $(VENV)/bin/python
	$(BIN)/python -m pip install -q uv

# The demo's packages are compiled to bytecode at install, as pip does: where
# PYTHONDONTWRITEBYTECODE is set, nothing else ever compiles them, and torch took 5.3 s to
# import instead of 2.3 s. The test environment's are not: compiling all of torch and
# TensorFlow took 20 s; the tests compile the part they import (`warm`, then as they go).
$(DEMO_STAMP): pyproject.toml constraints-dev.txt excludes-dev.txt | $(BIN)/uv
	$(PIP) --compile-bytecode -e '.[torch]'
	touch $@

$(TEST_STAMP): pyproject.toml constraints-dev.txt excludes-dev.txt | $(BIN)/uv
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

# bytecode for what most test processes import, written once before the test processes
# start (three collecting at once would each compile the same modules); torch and
# TensorFlow in two processes, one a core
warm: warm-torch warm-tensorflow
warm-torch: $(TEST_STAMP)
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -c "import torch, torch._dynamo, torch.distributed, torch.nn.parallel"
warm-tensorflow: $(TEST_STAMP)
	PYTHONDONTWRITEBYTECODE= TF_CPP_MIN_LOG_LEVEL=3 TF_ENABLE_ONEDNN_OPTS=0 $(BIN)/python -c "import tensorflow, \
	keras, matplotlib.pyplot, h5py, PIL.Image, rich, psutil"

# programs some tests drive from outside (chromium, tmux): installed when missing, never fatal
system-packages:
	-.ci/system-packages

# two tiers: tests/unit (no processes, no sleeps, no real clocks) and tests/integration
# (real loops, torchrun, Chromium, tmux). One test process more than this machine's two
# cores keeps them busy while a test waits on a child; four were no faster and turned the
# verdicts of tests that judge CPU shares (docs/dev/test-suite.md). Bytecode is written: where
# PYTHONDONTWRITEBYTECODE is set, each Python process a test starts would compile loadprof
# and the modules `warm` left out again, and each test process would rewrite every test module.
# The slowest tests are listed at the end: where the suite's time goes, run by run.
TEST_JOBS ?= 3
pytest: $(TEST_STAMP) system-packages
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q -ra -n $(TEST_JOBS) --dist worksteal --durations=20

# for iteration: lint, types and the unit tier (CI runs the whole suite)
test-fast: lint typecheck
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q -ra tests/unit

# lint, type checks and the bytecode side by side, then the suite
test: $(TEST_STAMP)
	$(MAKE) --no-print-directory -j4 lint typecheck warm
	$(MAKE) --no-print-directory pytest

bench: $(DEMO_STAMP)
	$(BIN)/python benchmarks/overhead.py

clean:
	rm -rf $(VENV) build *.egg-info demo-run.json
