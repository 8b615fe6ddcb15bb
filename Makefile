# One entry point for people and CI. `make demo` and `make test` each set up what they need
# (a local .venv, the extension built into it) and are safe to rerun: the demo only maturin and
# the package (`.venv/.maturin`), the tests and lints every pinned tool (`.venv/.tools`).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
# The extension is rebuilt only when its sources change.
RUST_SOURCES := $(shell find crates -name '*.rs' -o -name '*.c' -o -name Cargo.toml) Cargo.toml Cargo.lock pyproject.toml
export CARGO_TERM_COLOR ?= never

.PHONY: setup build demo test lint test-rust test-python test-wheel test-py313 test-torch wheel fmt \
	clean bench soak docs chromium postgresql

setup: $(VENV)/.tools build

# What building the extension needs, and all the demo does: a venv with maturin, at its pin.
$(VENV)/.maturin: constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet maturin -c constraints.txt
	touch $@

# Every pinned tool the tests and lints use (pytest, ruff, mypy, numpy, pandas, Ray, OTel).
$(VENV)/.tools: $(VENV)/.maturin constraints.txt
	$(PY) -m pip install --quiet -r constraints.txt -c constraints.txt
	touch $@

build: $(VENV)/.built

$(VENV)/.built: $(VENV)/.maturin $(RUST_SOURCES)
	# A module built for another ABI (`_soma.cpython-311-….so` beside `_soma.abi3.so`) would be
	# imported first and run stale code: only the one built now stays.
	rm -f python/soma/_soma.*.so
	VIRTUAL_ENV=$(abspath $(VENV)) $(BIN)/maturin develop --release --quiet
	touch $@

demo: build
	$(PY) examples/quickstart.py

lint: setup docs
	cargo fmt --all --check
	cargo clippy --workspace --all-targets --locked -- -D warnings
	$(BIN)/ruff check python tests examples benches/python docs/hooks
	$(BIN)/ruff format --check python tests examples benches/python docs/hooks
	$(BIN)/mypy --strict python/soma
	$(BIN)/mypy --strict tests/typing
	$(PY) -m mypy.stubtest soma._soma
	RUSTDOCFLAGS="-D warnings" cargo doc -p soma-core --no-deps --locked --quiet

test-rust:
	cargo test --workspace --locked

test-python: setup chromium postgresql
	$(BIN)/pytest

test: lint test-rust test-python test-wheel

# The documentation site (mkdocs.yml): the guide a topic a page and the API reference generated
# from the docstrings, built into site/ in strict mode — a broken link or anchor, an unknown
# cross-reference or a public name without a docstring fails it — and read from file:// with
# nothing fetched (open site/index.html). `make lint` builds it; tests/test_site.py opens it.
docs: $(VENV)/.tools
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# The browser tests/test_site.py opens the site in: Debian's chromium and its driver, installed
# once (as root; elsewhere the browser's tests skip and say why).
chromium:
	.ci/chromium-from-debian.sh

# The database server tests/test_journal_postgres.py runs a journal against: Debian's
# postgresql, installed once (as root; elsewhere those tests skip and say why). The tests start
# and stop a throwaway cluster of their own (tests/_postgres.py).
postgresql:
	.ci/postgresql-from-debian.sh

# What a user installs: one wheel for every CPython from 3.11 on (abi3), and the sdist that
# `pip install` builds from where no wheel fits (it needs Rust). Rebuilt when a source changes.
PACKAGE_SOURCES := $(RUST_SOURCES) README.md $(shell find python/soma -name '*.py' -o -name '*.pyi' -o -name py.typed -o -path '*/static/*' -type f)
wheel: dist/.built

dist/.built: $(VENV)/.tools $(PACKAGE_SOURCES)
	rm -rf dist
	$(BIN)/maturin build --release --quiet --out dist
	$(BIN)/maturin sdist --out dist
	touch $@

# The wheel installed into a fresh venv outside the checkout, then the quickstart and one run of
# each feature from there (tests/installed/).
test-wheel: wheel setup
	SOMA_WHEELS=$(abspath dist) $(BIN)/pytest tests/installed

# The whole suite on CPython 3.13, which Debian bookworm does not package: built once from
# Debian's source package into a cache folder outside the checkout (.ci/cpython-from-debian.sh;
# about ten minutes on two cores), with the same wheel installed as a user would.
CPYTHON_CACHE ?= $(HOME)/.cache/soma/cpython
VENV313 := .venv-3.13

test-py313: wheel $(VENV313)/.tools
	$(VENV313)/bin/python -m pip install --quiet --force-reinstall --no-deps --no-index dist/*.whl
	SOMA_WHEELS=$(abspath dist) $(VENV313)/bin/pytest

$(CPYTHON_CACHE)/3.13/.built:
	.ci/cpython-from-debian.sh 3.13 $(CPYTHON_CACHE) >/dev/null

$(VENV313)/.tools: constraints.txt $(CPYTHON_CACHE)/3.13/.built
	rm -rf $(VENV313)
	$(CPYTHON_CACHE)/3.13/install/bin/python3.13 -m venv $(VENV313)
	$(VENV313)/bin/python -m pip install --quiet --upgrade pip
	$(VENV313)/bin/python -m pip install --quiet -r constraints.txt -c constraints.txt
	touch $@

# torch is a few GB installed, so `setup` leaves it out and `make test` leaves its tests out.
# This installs it into .venv (pinned in tests/with_torch/requirements.txt: the ordinary wheel
# from PyPI) and runs tests/with_torch/ — the guide's blocks that import torch among them — and
# the examples that import torch, which `make test` skips where torch is not installed. CI runs
# it after `make test` (.ci/run).
test-torch: $(VENV)/.torch build
	SOMA_TORCH_TESTS=1 $(BIN)/pytest tests/with_torch tests/test_examples.py -k "with_torch or torch_"

$(VENV)/.torch: $(VENV)/.tools tests/with_torch/requirements.txt
	$(PY) -m pip install --quiet -r tests/with_torch/requirements.txt -c constraints.txt
	touch $@

# The hostile sequences (tests/test_hostile_sequences.py) at length: fresh random sequences on
# every run, a thousand of them, where `make test` replays the same few.
soak: setup
	SOMA_SOAK=1 $(BIN)/pytest tests/test_hostile_sequences.py -q --timeout=3600

fmt: $(VENV)/.tools
	cargo fmt --all
	$(BIN)/ruff format python tests examples benches/python docs/hooks
	$(BIN)/ruff check --fix python tests examples benches/python docs/hooks

# Benchmarks: criterion for the engine, then Soma against a plain loop and its peers from
# Python. Timings only, never assertions; BENCHMARKS.md says how to read them. The torch rows of
# modules.py run where torch is installed (`make test-torch` installs it) and say "not run" else.
bench: setup $(VENV)/.bench-peers
	cargo bench -p soma-core --locked
	$(PY) benches/python/criterion_table.py --out target/bench-rust.md
	$(PY) benches/python/bench.py --out target/bench-python.md
	$(PY) benches/python/stream.py --out target/bench-stream.md
	$(PY) benches/python/deadline.py --out target/bench-deadline.md
	$(PY) benches/python/policies.py --out target/bench-policies.md
	$(PY) benches/python/cache.py --out target/bench-cache.md
	$(PY) benches/python/decide.py --out target/bench-decide.md
	$(PY) benches/python/aio.py --out target/bench-aio.md
	$(PY) benches/python/modules.py --out target/bench-modules.md
	$(PY) benches/python/watch.py --out target/bench-watch.md
	$(PY) benches/python/remote.py --out target/bench-remote.md \
		|| echo "remote: the hosts benchmark needs Ray on a local cluster; not run"

# Ray is heavy and optional: when it cannot be installed the benchmark reports it as not run.
$(VENV)/.bench-peers: $(VENV)/.tools benches/python/requirements.txt benches/python/ray.txt
	$(PY) -m pip install --quiet -r benches/python/requirements.txt -c constraints.txt
	$(PY) -m pip install --quiet -r benches/python/ray.txt -c constraints.txt \
		|| echo "ray not installed: the benchmark will report it as not run"
	touch $@

clean:
	rm -rf $(VENV) $(VENV313) target dist site
