"""The engine: plain Python, no Dagster. One package per job, in the order a lead meets them:

- `intake/`      the signed webhook intake, and what a lead is
- `sources/`     `sources.yaml` read into typed specs
- `adapters/`    per source kind: the requests for a lead, and how its answers become records
- `scheduling/`  what goes to Dagster when: the dispatcher, priority classes, budgets
- `collection/`  one collection (plan, fetch, parse, store) and the one door every request takes
- `pacing/`      rate lanes shared by every process, jitter, AIMD, circuits, one request's throttle
- `identities/`  the identity pool: leases, health, sessions
- `net/`         the SSRF guard, pinned connections, redaction
- `evidence/`    records (Parquet), captures (WARC), case packages
- `store/`       the state store (SQLite or Postgres) every process shares
- `fleet/`       the fleet's view of itself: figures, `/metrics`, alert rules, degradation
- `sandbox/`, `demo/`  the bundled sandbox web and `make run`'s demo fleet

`composition.py` builds a process's engine from `config.py`'s settings; `cli.py` is the CLI.
"""
