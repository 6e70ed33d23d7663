# cronoq developer commands. `make test` works on a fresh machine: it builds .venv/ first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test fuzz chaos run bench bench-history bench-peers bench-takeover lint typecheck venv engine-native clean image deploy-check

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP) engine-native

# The engine compiled to C extensions by mypyc beside its sources (scripts/build_engine.py: a minute
# or two, nothing when the build is current). The engine runs its Python sources instead when the
# build is missing or older than them, or with CRONOQ_PURE_PYTHON=1 (which also skips the build).
engine-native: $(STAMP)
	$(PY) scripts/build_engine.py

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(PY) scripts/typecheck.py

test: lint typecheck engine-native
	bash scripts/ensure_postgres.sh
	bash scripts/ensure_docker.sh
	PYTHON=$(PY) bash scripts/ensure_helm.sh >/dev/null
	bash scripts/ensure_promtool.sh >/dev/null
	bash scripts/ensure_chromium.sh
	$(PY) -m pytest -q
	# The engine's own tests once more on its Python sources (the run above used the compiled ones).
	CRONOQ_PURE_PYTHON=1 $(PY) -m pytest -q -p no:cacheprovider tests/engine

# The container image cronoq:dev, built offline on a local Debian base (scripts/build_image.sh).
image: $(STAMP)
	PYTHON=$(PY) bash scripts/build_image.sh

# Only the deployment tests: the image, both Helm charts, the operator, alert rules, dashboard,
# KEDA and systemd files (tests/deploy; `make test` runs them too).
deploy-check: $(STAMP)
	bash scripts/ensure_docker.sh
	$(PY) -m pytest -q tests/deploy

# The fuzz tests with many more examples (CRONOQ_FUZZ=long multiplies the short runs of `make test`
# by CRONOQ_FUZZ_SCALE, default 40; tests/fuzz/budget.py). FUZZ_TESTS lists what runs; property tests
# elsewhere take the same switch through tests.fuzz.budget.examples().
FUZZ_TESTS ?= tests/fuzz tests/engine/test_properties.py tests/engine/test_bounds.py tests/conformance/test_extreme_values.py
fuzz: $(STAMP)
	bash scripts/ensure_postgres.sh
	CRONOQ_FUZZ=long $(PY) -m pytest -q -s $(FUZZ_TESTS)

# The failover drills (README "Failover drills"): CHAOS_ARGS passes options, e.g.
# make chaos CHAOS_ARGS="leader-kill --runs 20 --store postgres --report chaos-report".
CHAOS_ARGS ?= all --runs 1 --report chaos-report
chaos: $(STAMP)
	$(PY) -m cronoq.chaos run $(CHAOS_ARGS)

# A 2-shard x 2-replica cluster on SQLite in a temporary folder, with workers and a burst of
# forwarded tasks; serves until Ctrl-C (the embedded tour: $(PY) -m cronoq.demo_embedded).
run: $(STAMP)
	$(PY) -m cronoq.demo

bench: $(STAMP) engine-native
	bash scripts/ensure_wrk.sh
	$(PY) loadtests/engine_bench.py
	$(PY) loadtests/embedded_bench.py
	$(PY) loadtests/store_bench.py
	$(PY) loadtests/server_bench.py
	$(PY) loadtests/producer_bench.py
	$(PY) loadtests/shard_scaling.py

# Takeover on Postgres after a leader is killed or frozen, with 0, 100k and 10^6 live tasks, and the
# engine's bytes per pending task (loadtests/takeover_bench.py; about ten minutes). TAKEOVER_ARGS
# passes options, e.g. make bench-takeover TAKEOVER_ARGS="--sizes 0,100000".
bench-takeover: $(STAMP)
	bash scripts/ensure_postgres.sh
	cd loadtests && ../$(PY) takeover_bench.py $(TAKEOVER_ARGS)

# Task-history page latency from 10^3 to 10^6 stored tasks, SQLite and Postgres (a few minutes).
bench-history: $(STAMP)
	bash scripts/ensure_postgres.sh
	$(PY) loadtests/history_bench.py

# cronoq beside pgqueuer, procrastinate, Celery, Dramatiq and arq (loadtests/peers/README.md): the local
# Postgres (CRONOQ_BENCH_DSN) and Redis (CRONOQ_BENCH_REDIS); a 10^6-task backlog, so it takes a while.
# PEERS_ARGS passes options, e.g. make bench-peers PEERS_ARGS="--backlog 100000".
bench-peers: $(STAMP)
	$(PY) loadtests/peers/bench.py --jsonl bench-peers.jsonl --markdown bench-peers.md $(PEERS_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
	$(PYTHON) scripts/build_engine.py --clean
