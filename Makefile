# One entry point for people and CI. `make demo` and `make test` each set up what they need
# (a local .venv with pinned tools, the extension built into it) and are safe to rerun.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
# The extension is rebuilt only when its sources change.
RUST_SOURCES := $(shell find crates -name '*.rs' -o -name Cargo.toml) Cargo.toml Cargo.lock pyproject.toml
export CARGO_TERM_COLOR ?= never

.PHONY: setup build demo test lint test-rust test-python fmt clean

setup: $(VENV)/.tools build

$(VENV)/.tools: constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r constraints.txt -c constraints.txt
	touch $@

build: $(VENV)/.built

$(VENV)/.built: $(VENV)/.tools $(RUST_SOURCES)
	VIRTUAL_ENV=$(abspath $(VENV)) $(BIN)/maturin develop --release --quiet
	touch $@

demo: setup
	$(PY) examples/quickstart.py

lint: setup
	cargo fmt --all --check
	cargo clippy --workspace --all-targets --locked -- -D warnings
	$(BIN)/ruff check python tests examples
	$(BIN)/ruff format --check python tests examples
	$(BIN)/mypy --strict python/soma

test-rust:
	cargo test --workspace --locked

test-python: setup
	$(BIN)/pytest

test: lint test-rust test-python

fmt: $(VENV)/.tools
	cargo fmt --all
	$(BIN)/ruff format python tests examples
	$(BIN)/ruff check --fix python tests examples

clean:
	rm -rf $(VENV) target
