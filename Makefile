# Two entry points (see README): `make demo` runs the whole pipeline on the built-in synthetic graph,
# `make test` runs the test suite. Both create or reuse the virtual environment at .venv first.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# The whole suite runs its test files on this many pytest-xdist workers: its end-to-end tests spend much
# of their time waiting on processes they started (Ray, servers), so two share two cores well.
TEST_WORKERS ?= 2

.PHONY: install demo test test-quick compile
install: $(VENV)/.installed

# The project's own modules, byte-compiled ahead (only the files changed since the last time): where
# PYTHONDONTWRITEBYTECODE is set, as on this project's machines, every process the suite or the demo starts
# (each Ray worker, each command a test runs) would otherwise compile them again on import.
compile: install
	$(PY) -m compileall -q seeder pipelines tune tests benchmarks > /dev/null

# torch is installed first and pinned: an unpinned torch pulls a multi-GB CUDA build. pip byte-compiles what
# it installs on one core; compileall does the same on every core (a file that does not compile, such as a
# package's template, is skipped by both, hence the `|| true`).
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile torch==2.13.0
	$(PY) -m pip install -q --no-compile -e '.[test]'
	$(PY) -m compileall -q -j 0 "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" > /dev/null || true
	touch $@

demo: compile
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bash scripts/demo.sh

test: compile
	$(VENV)/bin/python -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The unit loop: no Ray (a test that starts a Ray node fails; see tests/without_ray), no servers, no browser.
test-quick: install
	SEEDER_TEST_QUICK=1 $(VENV)/bin/python -m pytest -m "not e2e and not slow" $(PYTEST_ARGS)
