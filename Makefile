# Two entry points, each self-contained on a fresh machine (Python, pip and a C compiler):
#   make demo   - build .venv and run the `anynum` command's default job
#   make test   - build .venv and run lint, type checks and the test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	# torch first and pinned: a bare `torch` requirement would pull a multi-GB CUDA build.
	$(BIN)/pip install torch==2.13.0

.venv/.installed-%: $(BIN)/activate pyproject.toml
	$(BIN)/pip install -e ".[$*]"
	touch $@

.PHONY: demo test lint docs
demo: .venv/.installed-cli
	$(BIN)/anynum

lint: .venv/.installed-test
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy

# The API reference from the docstrings; warnings are errors (tests/test_docs.py runs the examples).
docs: .venv/.installed-test
	$(BIN)/mkdocs build --strict --quiet

# The venv's bin first on PATH: the peers' C++ extensions (QPyTorch, Qtorch+) build with the
# ninja that pip installed there.
test: .venv/.installed-test .venv/.installed-cli lint docs
	PATH="$(abspath $(BIN)):$$PATH" ANYNUM_COMPILE=0 $(BIN)/python -m pytest -n 2 -q
