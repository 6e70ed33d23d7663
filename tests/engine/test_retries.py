"""Retries, backoff with jitter, timeouts, leases and stale reports, driven through the engine.

Spec: retries-timeouts-leases.txt (attempts and outcomes, exactly-once side effects, retry policy,
timeouts, leases and heartbeats, dead letters); reference-facts.md section 2 (RetryPolicy).
"""

from __future__ import annotations

from itertools import pairwise

from cronoq.engine import (
    Failure,
    PoolConfig,
    RetryPolicy,
    Success,
    TaskStatus,
)
from cronoq.engine.types import NS_PER_S

from .sim import Sim, ns


def make(retry: RetryPolicy | None = None, workers: int = 4, **config: object) -> Sim:
    pool = PoolConfig(
        "default",
        max_workers=max(workers, 1),
        initial_workers=workers,
        retry=retry if retry is not None else RetryPolicy(),
    )
    return Sim.make(pool, **config)


def attempts_of(sim: Sim, task_id: int) -> list[int]:
    return [lease.attempt for lease in sim.dispatched if lease.task_id == task_id]


def starts_of(sim: Sim, task_id: int) -> list[int]:
    return [lease.started_at for lease in sim.dispatched if lease.task_id == task_id]


def totals(sim: Sim) -> dict[str, int]:
    return sim.core.snapshot(sim.now).totals


# ---------------------------------------------------------------------------------------------
# Policy


def test_retry_policy_defaults() -> None:
    policy = RetryPolicy()
    assert policy.max_attempts == 3
    assert policy.initial_backoff == NS_PER_S
    assert policy.multiplier == 2.0
    assert policy.max_backoff == 60 * NS_PER_S
    assert policy.jitter is True
    assert RetryPolicy.none().max_attempts == 1
    assert PoolConfig("p").retry == RetryPolicy()


def test_backoff_formula() -> None:
    policy = RetryPolicy(max_attempts=12)
    assert [policy.backoff(n) / NS_PER_S for n in range(2, 11)] == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    slow = RetryPolicy(initial_backoff=ns(0.5), multiplier=3.0, max_backoff=ns(10))
    assert [slow.backoff(n) / NS_PER_S for n in range(2, 6)] == [0.5, 1.5, 4.5, 10]


def test_default_pool_retry_gives_three_attempts_then_dead_letter() -> None:
    sim = Sim.make(PoolConfig("default", max_workers=1, initial_workers=1))
    tid = sim.submit("flaky")
    for n in range(1, 4):
        assert sim.status(tid) == "running"
        sim.fail(sim.lease_of(tid), f"failure {n}")
        sim.advance(5)
    assert sim.status(tid) == "dead_lettered"
    assert attempts_of(sim, tid) == [1, 2, 3]


def test_unjittered_delays_grow_and_cap() -> None:
    sim = make(RetryPolicy(max_attempts=10, jitter=False))
    sim.runner = lambda lease: (0.0, Failure("always fails"))
    tid = sim.submit("always fails")
    sim.advance(600)
    assert sim.status(tid) == "dead_lettered"
    starts = starts_of(sim, tid)
    gaps = [(b - a) / NS_PER_S for a, b in pairwise(starts)]
    assert gaps == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    assert attempts_of(sim, tid) == list(range(1, 11))


def test_retry_waits_in_retrying_then_becomes_ready_at_backoff() -> None:
    sim = make(RetryPolicy(jitter=False))
    tid = sim.submit("x")
    sim.fail(sim.lease_of(tid))
    assert sim.status(tid) == "retrying"
    sim.advance(0.999)
    assert sim.status(tid) == "retrying"
    sim.advance(0.001)
    assert sim.status(tid) == "running"
    assert totals(sim)["retries"] == 1


def test_full_jitter_stays_within_backoff_and_varies() -> None:
    sim = make(RetryPolicy(jitter=True), workers=50)
    ids = [sim.submit(i) for i in range(50)]
    failed_at = sim.now
    for tid in ids:
        sim.fail(sim.lease_of(tid))
    sim.advance(1)
    delays = []
    for tid in ids:
        starts = starts_of(sim, tid)
        assert len(starts) == 2, "every retry happens within the 1 s backoff"
        delays.append(starts[1] - failed_at)
    assert all(0 <= d <= NS_PER_S for d in delays)
    assert len(set(delays)) > 40  # uniformly random, not a fixed delay
    assert min(delays) < NS_PER_S // 4 and max(delays) > 3 * NS_PER_S // 4

    # The second retry of each task falls within [0, 2 s] of its second failure.
    for tid in ids:
        sim.fail(sim.lease_of(tid))
    second_failed_at = sim.now
    sim.advance(2)
    for tid in ids:
        starts = starts_of(sim, tid)
        assert len(starts) == 3
        assert 0 <= starts[2] - second_failed_at <= 2 * NS_PER_S


def _jittered_retry_times(seed: int) -> list[int]:
    sim = make(RetryPolicy(jitter=True), workers=10, seed=seed)
    ids = [sim.submit(i) for i in range(10)]
    for tid in ids:
        sim.fail(sim.lease_of(tid))
    sim.advance(1)
    return [starts_of(sim, tid)[1] for tid in ids]


def test_jitter_comes_from_the_seeded_rng() -> None:
    assert _jittered_retry_times(7) == _jittered_retry_times(7)
    assert _jittered_retry_times(7) != _jittered_retry_times(8)


def test_retry_after_is_a_lower_bound() -> None:
    sim = make(RetryPolicy(jitter=True))
    tid = sim.submit("rate limited")
    sim.complete(sim.lease_of(tid), Failure("429", retry_after=ns(5)))
    failed_at = sim.now
    sim.advance(4.99)
    assert sim.status(tid) == "retrying"
    sim.advance(0.01)
    assert sim.status(tid) == "running"
    assert starts_of(sim, tid)[1] - failed_at == ns(5)


def test_retry_after_below_backoff_keeps_the_backoff() -> None:
    sim = make(RetryPolicy(jitter=False, initial_backoff=ns(4)))
    tid = sim.submit("x")
    sim.complete(sim.lease_of(tid), Failure("429", retry_after=ns(1)))
    failed_at = sim.now
    sim.advance(10)
    assert starts_of(sim, tid)[1] - failed_at == ns(4)


def test_retry_after_does_not_grant_extra_attempts() -> None:
    sim = make(RetryPolicy(max_attempts=2, jitter=False))
    tid = sim.submit("x")
    sim.complete(sim.lease_of(tid), Failure("429", retry_after=ns(3)))
    sim.advance(3)
    sim.complete(sim.lease_of(tid), Failure("429 again", retry_after=ns(3)))
    assert sim.status(tid) == "dead_lettered"
    assert sim.info(tid).message == "429 again"


def test_per_task_retry_overrides_pool_default() -> None:
    sim = make(RetryPolicy(max_attempts=5, jitter=False))
    once = sim.submit("once", retry=RetryPolicy.none())
    sim.fail(sim.lease_of(once))
    assert sim.status(once) == "dead_lettered"
    assert sim.info(once).max_attempts == 1
    pool_default = sim.submit("default")
    assert sim.info(pool_default).max_attempts == 5


def test_retried_task_keeps_its_place_in_its_class() -> None:
    sim = make(RetryPolicy(jitter=False), workers=1)
    first = sim.submit("first")
    second = sim.submit("second")
    sim.advance(0.5)
    third = sim.submit("third")
    sim.fail(sim.lease_of(first))  # first retries in 1 s
    sim.advance(2)  # second is running; first is ready again
    assert sim.status(first) == "ready"
    sim.complete(sim.lease_of(second))
    # first was submitted before third, so it goes first.
    assert sim.status(first) == "running" and sim.status(third) == "ready"


# ---------------------------------------------------------------------------------------------
# Permanent failures and dead letters


def test_permanent_failure_ends_failed_without_retry() -> None:
    sim = make(RetryPolicy(max_attempts=5))
    tid = sim.submit("bad input")
    sim.fail(sim.lease_of(tid), "invalid customer id", permanent=True)
    sim.advance(120)
    info = sim.info(tid)
    assert info.status is TaskStatus.FAILED
    assert info.message == "invalid customer id"
    assert attempts_of(sim, tid) == [1]
    [resolve] = [r for r in sim.resolved if r.event.id == tid]
    assert resolve.event.message == "invalid customer id"
    assert totals(sim)["failed"] == 1 and totals(sim)["retries"] == 0


def test_dead_letter_keeps_the_last_message() -> None:
    sim = make(RetryPolicy(max_attempts=3, jitter=False))
    tid = sim.submit("x")
    for n in range(3):
        sim.fail(sim.lease_of(tid), f"attempt {n + 1} broke")
        sim.advance(10)
    info = sim.info(tid)
    assert info.status is TaskStatus.DEAD_LETTERED
    assert info.message == "attempt 3 broke"
    assert info.attempt == 3
    [resolve] = [r for r in sim.resolved if r.event.id == tid]
    assert resolve.event.status is TaskStatus.DEAD_LETTERED
    assert resolve.event.message == "attempt 3 broke"
    assert resolve.event.attempt == 3
    assert totals(sim)["dead_lettered"] == 1


def test_success_output_is_resolved() -> None:
    sim = make()
    tid = sim.submit("x")
    sim.complete(sim.lease_of(tid), Success({"answer": 42}))
    [resolve] = [r for r in sim.resolved if r.event.id == tid]
    assert resolve.has_output and resolve.output == {"answer": 42}
    assert sim.info(tid).has_output


# ---------------------------------------------------------------------------------------------
# Timeouts


def test_timeout_aborts_the_attempt_and_retries() -> None:
    sim = make(RetryPolicy(jitter=False))
    tid = sim.submit("hangs", timeout=ns(5))
    lease = sim.lease_of(tid)
    assert lease.timeout == ns(5)
    sim.advance(4.9)
    assert sim.aborts == []
    sim.advance(0.1)
    assert [a.lease_id for a in sim.aborts] == [lease.id]
    assert sim.status(tid) == "retrying"
    assert totals(sim)["timeouts"] == 1
    # The hung attempt reporting late is stale.
    assert sim.complete(lease) is False
    assert totals(sim)["stale_completions"] == 1
    sim.advance(1)
    second = sim.lease_of(tid)
    assert second.attempt == 2 and second.id != lease.id
    sim.complete(second)
    assert sim.status(tid) == "succeeded"


def test_timeout_of_last_attempt_dead_letters() -> None:
    sim = make(RetryPolicy(max_attempts=2, jitter=False))
    tid = sim.submit("hangs", timeout=ns(2))
    sim.advance(2)
    sim.advance(1)
    sim.advance(2)
    assert sim.status(tid) == "dead_lettered"
    assert len(sim.aborts) == 2
    assert "time" in (sim.info(tid).message or "")


def test_timeout_is_per_attempt() -> None:
    sim = make(RetryPolicy(jitter=False))
    tid = sim.submit("x", timeout=ns(5))
    sim.advance(3)
    sim.fail(sim.lease_of(tid))
    sim.advance(1)  # attempt 2 starts here; the first attempt's timer must not hit it
    second = sim.lease_of(tid)
    sim.advance(4.5)
    assert sim.lease_of(tid) is second
    sim.advance(0.5)
    assert sim.status(tid) == "retrying"


def test_timed_out_attempt_frees_its_slot() -> None:
    sim = make(RetryPolicy(jitter=False), workers=1)
    hung = sim.submit("hung", timeout=ns(5))
    other = sim.submit("other")
    sim.advance(5)
    assert sim.status(other) == "running"
    assert sim.status(hung) == "retrying"


# ---------------------------------------------------------------------------------------------
# Leases


def lease_sim(ttl: float = 10) -> Sim:
    pool = PoolConfig("default", max_workers=2, initial_workers=2, lease_ttl=ns(ttl), retry=RetryPolicy(jitter=False))
    return Sim.make(pool)


def test_heartbeats_keep_a_lease_alive() -> None:
    sim = lease_sim()
    tid = sim.submit("long")
    lease = sim.lease_of(tid)
    assert lease.lease_ttl == ns(10)
    for _ in range(30):
        sim.advance(4)
        assert sim.core.heartbeat(sim.now, lease.id) is True
    assert sim.aborts == []
    assert sim.status(tid) == "running"
    assert sim.complete(lease) is True
    assert sim.status(tid) == "succeeded"


def test_missing_heartbeat_expires_the_lease() -> None:
    sim = lease_sim()
    tid = sim.submit("worker died")
    lease = sim.lease_of(tid)
    sim.advance(6)
    sim.core.heartbeat(sim.now, lease.id)
    sim.advance(9.9)
    assert sim.status(tid) == "running"
    sim.advance(0.1)  # 10 s after the last heartbeat
    assert [a.lease_id for a in sim.aborts] == [lease.id]
    assert sim.status(tid) == "retrying"
    assert totals(sim)["lease_expiries"] == 1
    assert sim.core.heartbeat(sim.now, lease.id) is False
    assert sim.complete(lease) is False
    sim.advance(1)
    assert sim.lease_of(tid).attempt == 2


def test_lease_without_heartbeat_expires_at_ttl() -> None:
    sim = lease_sim(ttl=3)
    tid = sim.submit("x")
    sim.advance(3)
    assert sim.status(tid) == "retrying"


def test_lease_expiry_on_last_attempt_dead_letters() -> None:
    sim = lease_sim(ttl=3)
    tid = sim.submit("x", retry=RetryPolicy.none())
    sim.advance(3)
    assert sim.status(tid) == "dead_lettered"
    assert sim.info(tid).message


def test_pools_without_ttl_never_expire_leases() -> None:
    sim = make()
    tid = sim.submit("x")
    sim.advance(24 * 3600)
    assert sim.status(tid) == "running"
    assert sim.aborts == []


# ---------------------------------------------------------------------------------------------
# Stale reports and fencing tokens


def test_duplicate_completion_is_stale() -> None:
    sim = make()
    tid = sim.submit("x")
    lease = sim.lease_of(tid)
    assert sim.complete(lease) is True
    assert sim.complete(lease, Failure("late failure")) is False
    assert sim.status(tid) == "succeeded"
    assert totals(sim)["stale_completions"] == 1


def test_report_for_an_earlier_attempt_is_stale() -> None:
    sim = make(RetryPolicy(jitter=False))
    tid = sim.submit("x", timeout=ns(2))
    first = sim.lease_of(tid)
    sim.advance(2)
    sim.advance(1)
    second = sim.lease_of(tid)
    assert sim.complete(first, Success("from the first attempt")) is False
    assert sim.status(tid) == "running"
    assert sim.complete(second, Success("from the second")) is True
    [resolve] = [r for r in sim.resolved if r.event.id == tid]
    assert resolve.output == "from the second"


def test_unknown_lease_is_stale() -> None:
    sim = make()
    assert sim.core.complete(sim.now, 999_999, Success(None)) is False
    assert totals(sim)["stale_completions"] == 1


def test_attempt_numbers_and_lease_ids_never_repeat() -> None:
    sim = Sim.make(
        PoolConfig(
            "default",
            max_workers=3,
            initial_workers=3,
            lease_ttl=ns(4),
            retry=RetryPolicy(max_attempts=6, jitter=False),
        )
    )
    tid = sim.submit("x", timeout=ns(6))
    sim.fail(sim.lease_of(tid))  # attempt 1 fails
    sim.advance(1)
    lease = sim.lease_of(tid)  # attempt 2 times out (heartbeats keep the lease)
    sim.advance(3)
    sim.core.heartbeat(sim.now, lease.id)
    sim.advance(3)
    assert sim.aborts[-1].reason == "timeout"
    sim.advance(2)
    sim.lease_of(tid)  # attempt 3 loses its lease (no heartbeat)
    sim.advance(4)
    assert sim.aborts[-1].reason != "timeout"
    sim.advance(4)
    assert sim.complete(sim.lease_of(tid))  # attempt 4 succeeds
    assert attempts_of(sim, tid) == [1, 2, 3, 4]
    lease_ids = [lease.id for lease in sim.dispatched]
    assert len(set(lease_ids)) == len(lease_ids)
    assert sim.status(tid) == "succeeded"
    assert (totals(sim)["timeouts"], totals(sim)["lease_expiries"], totals(sim)["retries"]) == (1, 1, 3)
