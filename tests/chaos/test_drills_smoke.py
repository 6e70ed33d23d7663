"""One short run of every drill against a real cluster (real servers, producers and workers, real
faults): the fault happens, the run drains, and the checker finds every promise kept.

Drills on Postgres that do not stop it share the session's Postgres (``postgres_dsn``, each run in
schemas of its own); ``postgres-restart`` starts a throwaway server it may crash. The rest run on
SQLite. The partition drills run with network namespaces where the machine allows them (root in
CI; they bring a throwaway Postgres in a namespace of its own), and once more through the loopback
proxies, the fallback. The long measurements are ``make chaos``, not this."""

from __future__ import annotations

import pytest
from cronoq.chaos.drills import load
from cronoq.chaos.netns import available as netns_available
from cronoq.chaos.run import RunOptions, RunOutcome, outcome_json, run_drill

DRILLS = load()


def _leaderless(outcome: RunOutcome) -> bool:
    return any(m.leaderless_s for m in outcome.result.faults)


def _client_errors(outcome: RunOutcome) -> bool:
    return any(m.errors for m in outcome.result.faults)


def _retried(outcome: RunOutcome) -> bool:
    return any(e.attempt >= 2 for e in outcome.history.executions)


def _nothing_cancelled(outcome: RunOutcome) -> bool:
    # A leader that wakes to find itself replaced answers the calls it had queued with
    # UNAVAILABLE (retried by clients), not CANCELLED.
    return all(code != "cancelled" for _, _, code in outcome.history.client_errors)


def _partitioned_with_namespaces(outcome: RunOutcome) -> bool:
    # Where the machine allows namespaces (root in CI), the default is to partition with them.
    return outcome.net == ("netns" if netns_available() else "proxy")


def _found_lock_session(outcome: RunOutcome) -> bool:
    return not any("found no lock session" in note for note in outcome.notes)


def _moved(outcome: RunOutcome) -> bool:
    # Every move ended with the target owning the pool, and some leader was killed meanwhile.
    moves = outcome.result.moves
    return len(moves) == 4 and all(m.duration_s is not None for m in moves) and any(m.fault for m in moves)


EXPECTED = {
    "leader-kill": [_leaderless],
    "leader-pause": [_leaderless, _nothing_cancelled],
    "pg-proxy-faults": [_found_lock_session],
    "partition-shards": [_client_errors, _partitioned_with_namespaces],
    "partition-replicas": [_client_errors, _partitioned_with_namespaces],
    "worker-silent": [_retried],
    "worker-slow": [_retried],
    "shard-lost": [_leaderless, _client_errors],
    "rolling-restart": [_leaderless],
    "restart-all": [_leaderless],
    "pool-move": [_moved, _leaderless],
}
"""What each fault must visibly do (so a drill whose fault silently missed cannot pass)."""
SMOKE = RunOptions(tasks=300, rate=100.0, pause_s=14.0, producers=2, workers_per_shard=2, drain_timeout_s=60.0)


@pytest.mark.parametrize("name", list(DRILLS))
async def test_drill_runs_and_every_promise_holds(name: str, request: pytest.FixtureRequest) -> None:
    await _smoke(name, request, "auto")


@pytest.mark.parametrize("name", [name for name, drill in DRILLS.items() if drill.netns])
async def test_partition_through_proxies_where_namespaces_are_not_allowed(
    name: str, request: pytest.FixtureRequest
) -> None:
    outcome = await _smoke(name, request, "proxy")
    assert outcome.net == "proxy"


async def _smoke(name: str, request: pytest.FixtureRequest, net: str) -> RunOutcome:
    drill = DRILLS[name]
    # pool-move on Postgres: on SQLite each of its leader kills costs a lease expiry (~10 s).
    store = "sqlite" if "sqlite" in drill.stores and name != "pool-move" else "postgres"
    dsn = None
    if store == "postgres" and not drill.own_postgres:
        dsn = request.getfixturevalue("postgres_dsn")
    options = RunOptions(
        **{
            **{field: getattr(SMOKE, field) for field in SMOKE.__dataclass_fields__},
            "store": store,
            "dsn": dsn,
            "shards": max(SMOKE.shards, drill.min_shards),
            "replicas": max(SMOKE.replicas, drill.min_replicas),
            "net": net,
        }
    )
    outcome = await run_drill(drill, options)
    summary = outcome_json(outcome)
    result = outcome.result
    assert outcome.drained, summary
    assert result.violations == [], summary
    assert result.tasks >= SMOKE.tasks and result.acknowledged == result.tasks, summary
    assert result.faults, f"the drill injected no fault: {summary}"
    assert all(fault.duration_s > 0 for fault in result.faults), summary
    # The workers ran every acknowledged task (the ledger saw each one succeed).
    succeeded = {e.task_id for e in outcome.history.executions if e.outcome == "succeeded"}
    acked = {s.task_id for s in outcome.history.submissions if s.acked}
    assert acked <= succeeded, summary
    for expectation in EXPECTED.get(name, []) if net == "auto" else []:
        assert expectation(outcome), f"{expectation.__name__} not seen: {summary}"
    if net == "proxy":
        assert _client_errors(outcome), summary
    return outcome
