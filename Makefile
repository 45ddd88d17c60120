# Two commands: `make run` (the demo fleet) and `make test` (the whole fast suite).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint test-postgres soak bench bench-product faults clean

run: $(STAMP)
	$(BIN)/investigations up

# Live tests (`pytest -m live`) reach the internet: never part of the suite.
test: $(STAMP) lint
	$(BIN)/pytest -m "not soak and not live" -q

# Lint (ruff) and types (mypy over investigations/, assets/, sensors/, resources/ and definitions.py),
# configured in pyproject.toml; part of `make test`.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

# Only the tests that need PostgreSQL (they also run in `make test`).
test-postgres: $(STAMP)
	$(BIN)/pytest -m postgres -q

# The long suites: the tests marked `soak`, then the soak run of the fault suite (Postgres, 10,000
# leads, kill -9 of run workers, the daemon and the intake, the database restarted twice; several
# hours on two cores; bench/README.md). SOAK_ARGS="--leads 2000" for a shorter one.
soak: $(STAMP)
	$(BIN)/pytest -m soak -q
	$(BIN)/python -m bench.faults --soak $(SOAK_ARGS)

# The pacing bench measures against nginx's limit_req, Debian's nginx-light.
bench: $(STAMP)
	@command -v nginx >/dev/null 2>&1 || test -x /usr/sbin/nginx || { apt-get update -qq && apt-get install -y -qq nginx-light; }
	$(BIN)/python -m bench

# The fault suite: a real fleet on loopback, processes killed with SIGKILL, on SQLite and Postgres
# (bench/README.md; FAULTS_ARGS="--leads 300 --kills 12 --backend sqlite" for a shorter run).
faults: $(STAMP)
	$(BIN)/python -m bench.faults $(FAULTS_ARGS)

# The product bench: the fleet as a user drives it (dagster-daemon, the CLI), each identity through its
# own tinyproxy, against nginx's limit_req (per address and site-wide). About 48 minutes.
bench-product: $(STAMP)
	@{ command -v nginx >/dev/null 2>&1 || test -x /usr/sbin/nginx; } && command -v tinyproxy >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq nginx-light tinyproxy; }
	$(BIN)/python -m bench.product

# The virtualenv is rebuilt whenever pyproject.toml changes.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

clean:
	rm -rf $(VENV) .investigations .dagster_home .pytest_cache
