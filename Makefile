# cronoq developer commands. `make test` works on a fresh machine: it builds .venv/ first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test run bench bench-history lint typecheck venv clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

typecheck: $(STAMP)
	$(PY) scripts/typecheck.py

test: lint typecheck
	bash scripts/ensure_postgres.sh
	bash scripts/ensure_chromium.sh
	$(PY) -m pytest -q

# A 2-shard x 2-replica cluster on SQLite in a temporary folder, with workers and a burst of
# forwarded tasks; serves until Ctrl-C (the embedded tour: $(PY) -m cronoq.demo_embedded).
run: $(STAMP)
	$(PY) -m cronoq.demo

bench: $(STAMP)
	$(PY) loadtests/engine_bench.py
	$(PY) loadtests/embedded_bench.py
	$(PY) loadtests/store_bench.py
	$(PY) loadtests/server_bench.py
	$(PY) loadtests/shard_scaling.py

# Task-history page latency from 10^3 to 10^6 stored tasks, SQLite and Postgres (a few minutes).
bench-history: $(STAMP)
	bash scripts/ensure_postgres.sh
	$(PY) loadtests/history_bench.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
