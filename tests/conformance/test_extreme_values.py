"""Extreme numbers through submit -> fail -> retry -> restart -> recover, on every store.

Hypothesis draws deadlines, fixed starts, tolerances, timeouts, duration hints, retry policies
and keys at and beyond every documented edge (0, negatives, +-inf, NaN, 1e308, 2**64, the int64
and century limits, NUL and lone surrogates). For each store (memory, a real SQLite file, a real
Postgres schema): a submission is refused as invalid exactly when a value is out of range;
otherwise the task is committed, dispatched, failed and retried a few times (every step
committed: no value admitted may fail a commit), left running, and a new leader recovers it
through the shard driver: it leads, its engine's invariants hold, the task is there with its
attempts counted, and no internal error was met on the way.

Spec: reference-facts.md (durations at most 100 years; RetryPolicy), durability-ha.txt
("Recovery": an interrupted attempt counts as used), design.md "Trust boundaries".
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import pytest
from cronoq.engine import (
    AdmissionError,
    Core,
    CoreConfig,
    Dispatch,
    Failure,
    PoolConfig,
    SubmitCode,
    TaskSpec,
    TaskStatus,
)
from cronoq.shard.driver import Driver
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.engine.extremes import apply_extremes, examples, extreme_params, out_of_range
from tests.stores.support import WAIT_S, Database, Sink

T0 = 1_700_000_000 * 10**9
DAY = 86_400 * 10**9

odd_keys = st.one_of(
    st.none(),
    st.sampled_from(["", "nul\0key", "lone \ud800", "ok", "ünïcode ✓", "x" * 300]),
    st.text(max_size=8),
)


def key_invalid(key: str | None) -> bool:
    if key is None:
        return False
    if key == "" or "\0" in key:
        return True
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def engine_config(epoch: int = 1, persist: bool = True) -> CoreConfig:
    return CoreConfig(pools=(PoolConfig("default", max_workers=1, initial_workers=1),), persist=persist,
                      id_epoch=epoch)  # fmt: skip


async def scenario(stores: Database, extremes: dict[str, object], key: str | None, failures: int) -> None:
    first = stores.store()
    epoch = await asyncio.wait_for(first.acquire_leadership(), WAIT_S)
    core = Core(engine_config(epoch), now=T0)
    now = T0
    spec = apply_extremes(TaskSpec(payload={"n": 1}, key=key), extremes)
    invalid = out_of_range(extremes) or key_invalid(key)
    try:
        task_id = core.submit(now, spec).id
    except AdmissionError as err:
        assert invalid and err.code is SubmitCode.INVALID, (err, extremes, key)
        await first.close()
        return
    assert not invalid, f"admitted out-of-range values: {extremes} key={key!r}"

    async def step() -> list[Dispatch]:
        core.tick(now)
        output = core.drain()
        if output.mutations:
            await first.commit(epoch, output.mutations)  # an admitted value never fails a commit
        return output.dispatches

    running = await step()
    for _ in range(failures):
        if not running:
            wake = core.next_wakeup()
            if wake is None or wake > now + DAY:
                break  # a start or a backoff beyond the test's horizon
            now = max(now, wake)
            running = await step()
            continue
        core.complete(now, running[0].id, Failure("extreme"))
        running = await step()
    before = core.get(task_id)
    assert before is not None
    await first.close()  # the leader goes away, possibly in the middle of an attempt

    second = stores.store()
    driver = Driver(engine_config(), Sink(), store=second, clock=lambda: now)
    try:
        await asyncio.wait_for(driver.lead(), WAIT_S)
        assert driver.leading
        recovered = driver.core
        assert recovered is not None
        recovered.check_invariants()
        assert recovered.totals["engine_errors"] == 0
        after = recovered.get(task_id)
        # The attempts are kept; with no backoff the new leader may already have started another.
        assert after is not None and before.attempt <= after.attempt <= before.attempt + 1
        if before.status is TaskStatus.RUNNING:
            # The interrupted attempt counts: the task retries, or it had no attempt left.
            assert after.status in (TaskStatus.RETRYING, TaskStatus.READY, TaskStatus.RUNNING,
                                    TaskStatus.DEAD_LETTERED)  # fmt: skip
            if after.status is TaskStatus.DEAD_LETTERED:
                assert after.attempt == after.max_attempts
        elif before.status.terminal:
            assert after.status is before.status
    finally:
        await driver.shutdown(0)
        await second.close()


def run(kind: str, dsn: str | None, extremes: dict[str, object], key: str | None, failures: int) -> None:
    with tempfile.TemporaryDirectory(prefix="cronoq-extreme-") as root:
        stores = Database(kind, Path(root), dsn)

        async def main() -> None:
            try:
                await scenario(stores, extremes, key, failures)
            finally:
                await stores.drop()

        asyncio.run(main())


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
def test_extreme_values_survive_submit_fail_retry_restart_recover(kind: str, request: pytest.FixtureRequest) -> None:
    dsn = request.getfixturevalue("postgres_dsn") if kind == "postgres" else None

    @settings(max_examples=examples({"memory": 30, "sqlite": 20, "postgres": 15}[kind]), deadline=None,
              suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
    @given(extreme_params, odd_keys, st.integers(0, 5))
    def check(extremes: dict[str, object], key: str | None, failures: int) -> None:
        run(kind, dsn, extremes, key, failures)

    check()
