"""A pool withheld from dispatch (a pool draining before it moves to another shard,
docs/pool-moves.md): its running attempts end as usual, nothing of it starts, other pools go on,
and releasing it starts what waited."""

from __future__ import annotations

from cronoq.engine import PoolConfig, RetryPolicy

from .sim import Sim


def two_pools() -> Sim:
    retry = RetryPolicy(max_attempts=3, initial_backoff=0, jitter=False)
    return Sim.make(
        PoolConfig("moving", max_workers=2, initial_workers=2, retry=retry),
        PoolConfig("staying", max_workers=2, initial_workers=2),
    )


def test_a_withheld_pool_starts_nothing_while_its_running_attempts_end() -> None:
    sim = two_pools()
    first, second = sim.submit("a", pool="moving"), sim.submit("b", pool="moving")
    assert sim.core.running_in("moving") == 2
    sim.core.withhold("moving")
    queued = sim.submit("c", pool="moving")  # admitted, and waits
    other = sim.submit("d", pool="staying")
    assert sim.status(queued) == "ready" and sim.status(other) == "running"

    sim.complete(sim.lease_of(first))  # a slot frees: still nothing of the pool starts
    sim.fail(sim.lease_of(second))  # an attempt that ends with a retry is not started again either
    sim.advance(5)
    assert sim.status(queued) == "ready"
    assert sim.status(second) == "ready"  # its retry is due, and waits
    assert sim.core.running_in("moving") == 0
    assert [lease.task_id for lease in sim.dispatched] == [first, second, other]

    sim.core.withhold("moving", False)
    sim.step()
    assert sim.status(queued) == "running" and sim.status(second) == "running"
    assert sim.lease_of(second).attempt == 2
    assert sim.core.running_in("moving") == 2
