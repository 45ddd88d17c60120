# Two commands: `make run` (the demo fleet) and `make test` (the whole fast suite).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-postgres soak bench bench-product clean

run: $(STAMP)
	$(BIN)/investigations up

test: $(STAMP)
	$(BIN)/pytest -m "not soak" -q

# Only the tests that need PostgreSQL (they also run in `make test`).
test-postgres: $(STAMP)
	$(BIN)/pytest -m postgres -q

soak: $(STAMP)
	$(BIN)/pytest -m soak -q

# The pacing bench measures against nginx's limit_req, Debian's nginx-light.
bench: $(STAMP)
	@command -v nginx >/dev/null 2>&1 || test -x /usr/sbin/nginx || { apt-get update -qq && apt-get install -y -qq nginx-light; }
	$(BIN)/python -m bench

# The product bench: the fleet as a user drives it (dagster-daemon, the CLI), each identity through its
# own tinyproxy, against nginx's limit_req (per address and site-wide). About 8 minutes.
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
