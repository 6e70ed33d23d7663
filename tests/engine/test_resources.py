"""Tests of engine.resources: semaphores, token buckets and FIFO parking."""

from __future__ import annotations

from typing import Any

import pytest
from cronoq.engine.config import ResourceConfig
from cronoq.engine.resources import ResourceTable
from cronoq.engine.types import NS_PER_S, ConfigError, Priority, SubmitCode
from hypothesis import given, settings
from hypothesis import strategies as st


def sem(name: str, permits: int) -> ResourceConfig:
    return ResourceConfig.semaphore(name, permits)


def bucket(name: str, rate: float, burst: int) -> ResourceConfig:
    return ResourceConfig.token_bucket(name, rate, burst)


# ---------------------------------------------------------------------------------------------
# Admission


def test_admission_errors() -> None:
    table = ResourceTable([sem("gpu", 4), bucket("api", 2.0, 3)], now=0)
    assert table.admission_error({}) is None
    assert table.admission_error({"gpu": 4, "api": 3}) is None
    assert table.admission_error({"gpu": 1}) is None

    err = table.admission_error({"tpu": 1})
    assert err is not None and err[0] is SubmitCode.UNKNOWN_RESOURCE and "tpu" in err[1]

    err = table.admission_error({"gpu": 5})
    assert err is not None and err[0] is SubmitCode.RESOURCE_EXCEEDS_CAPACITY
    err = table.admission_error({"api": 4})
    assert err is not None and err[0] is SubmitCode.RESOURCE_EXCEEDS_CAPACITY

    bad_amounts: tuple[Any, ...] = (0, -1, 1.5, True, "2", None)
    for bad in bad_amounts:
        err = table.admission_error({"gpu": bad})
        assert err is not None and err[0] is SubmitCode.INVALID, bad
    assert table.admission_error({"gpu": Priority.HIGH}) is None  # an int subclass is fine
    # The first offending entry decides.
    err = table.admission_error({"gpu": 1, "nope": 1, "api": 9})
    assert err is not None and err[0] is SubmitCode.UNKNOWN_RESOURCE


def test_duplicate_names_are_refused() -> None:
    with pytest.raises(ConfigError):
        ResourceTable([sem("x", 1), bucket("x", 1.0, 1)], now=0)


def test_park_refuses_impossible_and_duplicate_waiters() -> None:
    table = ResourceTable([sem("gpu", 2)], now=0)
    with pytest.raises(ValueError):
        table.park("gpu", 1, 3)
    with pytest.raises(ValueError):
        table.park("gpu", 1, 0)
    table.park("gpu", 1, 1)
    with pytest.raises(ValueError):
        table.park("gpu", 1, 1)


# ---------------------------------------------------------------------------------------------
# All-or-nothing acquisition


def test_empty_request_is_free() -> None:
    table = ResourceTable([sem("gpu", 1)], now=0)
    assert table.try_acquire({}, 0) is None
    table.release({}, 0)
    assert table.in_use("gpu") == 0


def test_all_or_nothing_with_two_semaphores() -> None:
    table = ResourceTable([sem("gpu", 2), sem("db", 1)], now=0)
    assert table.try_acquire({"db": 1}, 0) is None

    # db is short, so gpu must not be taken either.
    assert table.try_acquire({"gpu": 2, "db": 1}, 1) == "db"
    assert table.in_use("gpu") == 0
    assert table.in_use("db") == 1
    table.check_invariants()

    table.release({"db": 1}, 2)
    assert table.try_acquire({"gpu": 2, "db": 1}, 3) is None
    assert table.in_use("gpu") == 2
    assert table.in_use("db") == 1
    assert table.available("gpu", 3) == 0.0
    table.check_invariants()


def test_all_or_nothing_with_a_bucket() -> None:
    table = ResourceTable([sem("conc", 5), bucket("api", 1.0, 1)], now=0)
    assert table.try_acquire({"api": 1, "conc": 1}, 0) is None
    assert table.try_acquire({"conc": 2, "api": 1}, 0) == "api"
    assert table.in_use("conc") == 1
    assert table.available("api", 0) == 0.0
    # Buckets never get tokens back on release; semaphores do.
    table.release({"api": 1, "conc": 1}, 0)
    assert table.available("api", 0) == 0.0
    assert table.in_use("conc") == 0
    assert table.in_use("api") == 0
    table.check_invariants()


# ---------------------------------------------------------------------------------------------
# Semaphore release and FIFO wake


def test_semaphore_wake_is_fifo_and_not_overtaken() -> None:
    table = ResourceTable([sem("gpu", 4)], now=0)
    first, second = {"gpu": 2}, {"gpu": 2}
    assert table.try_acquire(first, 0) is None
    assert table.try_acquire(second, 0) is None

    assert table.try_acquire({"gpu": 3}, 1) == "gpu"
    table.park("gpu", 10, 3)  # big waiter at the head
    table.park("gpu", 11, 1)
    table.park("gpu", 12, 1)
    assert table.parked_count() == 3
    assert table.parked_count("gpu") == 3
    assert table.wake(1) == []

    # Two units free: both small waiters would fit, but the big one is first in line.
    table.release(first, 2)
    assert table.wake(2) == []
    assert table.parked_count() == 3

    # Four free: the big one and one small one fit together (3 + 1); the last one does not.
    table.release(second, 3)
    assert table.wake(3) == [10, 11]
    assert not table.is_parked(10) and not table.is_parked(11) and table.is_parked(12)
    # Nothing changed since: no second wake for the same units.
    assert table.wake(4) == []
    assert table.promised("gpu") == 4
    # The woken waiters acquire at dispatch, which settles their claims.
    assert table.try_acquire({"gpu": 3}, 5, waiter=10) is None
    assert table.try_acquire({"gpu": 1}, 5, waiter=11) is None
    assert table.in_use("gpu") == 4
    assert table.promised("gpu") == 0
    assert not table.has_claim(10)
    table.check_invariants()


def test_a_woken_task_that_gives_up_lets_the_next_one_in() -> None:
    # permits 4: A (1) is woken; B (3) does not fit on top of A's claim. If A then parks on
    # another resource or is cancelled, B must not be left waiting on an idle semaphore.
    for give_up in ("park_elsewhere", "fail_acquire", "cancel"):
        table = ResourceTable([sem("gpu", 4), sem("db", 1)], now=0)
        held = {"gpu": 4}
        assert table.try_acquire(held, 0) is None
        assert table.try_acquire({"db": 1}, 0) is None
        table.park("gpu", 1, 1)
        table.park("gpu", 2, 4)
        table.release(held, 1)
        assert table.wake(1) == [1]
        assert table.wake(1) == []  # no second promise of the same units
        if give_up == "park_elsewhere":
            table.park("db", 1, 1)
        elif give_up == "fail_acquire":
            assert table.try_acquire({"gpu": 1, "db": 1}, 2, waiter=1) == "db"
        else:
            assert not table.unpark(1)  # not parked, but its claim ends
        assert table.promised("gpu") == 0
        assert table.wake(2) == [2], give_up
        table.check_invariants()


def test_a_barger_takes_promised_units_and_the_claimant_gives_up() -> None:
    table = ResourceTable([sem("gpu", 1)], now=0)
    assert table.try_acquire({"gpu": 1}, 0) is None
    table.park("gpu", 1, 1)
    table.park("gpu", 2, 1)
    table.release({"gpu": 1}, 1)
    assert table.wake(1) == [1]
    # Another task, dispatched first by priority, takes the unit (with its own id, no claim).
    assert table.try_acquire({"gpu": 1}, 2, waiter=99) is None
    assert table.promised("gpu") == 1
    # The woken task finds nothing: its claim ends and it parks again, behind task 2.
    assert table.try_acquire({"gpu": 1}, 3, waiter=1) == "gpu"
    assert not table.has_claim(1)
    assert table.promised("gpu") == 0
    table.park("gpu", 1, 1)
    table.release({"gpu": 1}, 4)
    assert table.wake(4) == [2]
    table.check_invariants()


def test_acquiring_without_an_id_settles_the_oldest_claims() -> None:
    table = ResourceTable([sem("gpu", 4)], now=0)
    held = {"gpu": 4}
    assert table.try_acquire(held, 0) is None
    table.park("gpu", 1, 2)
    table.park("gpu", 2, 1)
    table.park("gpu", 3, 2)
    table.release(held, 1)
    assert table.wake(1) == [1, 2]
    assert table.promised("gpu") == 3
    # One unit taken anonymously counts against the oldest claim, in part.
    assert table.try_acquire({"gpu": 1}, 2) is None
    assert table.promised("gpu") == 2
    assert table.has_claim(1) and table.has_claim(2)
    assert table.try_acquire({"gpu": 1}, 2) is None
    assert not table.has_claim(1) and table.has_claim(2)
    assert table.promised("gpu") == 1
    table.check_invariants()
    assert table.try_acquire({"gpu": 1}, 2) is None
    assert table.promised("gpu") == 0
    # With every claim settled, one free unit is left; the 2-unit head still waits.
    assert table.wake(3) == []
    table.release({"gpu": 1}, 4)
    assert table.wake(4) == [3]
    table.check_invariants()


def test_unparking_the_head_lets_the_rest_through() -> None:
    table = ResourceTable([sem("gpu", 4)], now=0)
    held = {"gpu": 2}
    assert table.try_acquire(held, 0) is None
    table.park("gpu", 1, 3)
    table.park("gpu", 2, 1)
    table.park("gpu", 3, 1)
    assert table.wake(1) == []
    assert table.unpark(1)
    assert table.wake(2) == [2, 3]
    assert table.parked_count() == 0
    table.check_invariants()


def test_semaphore_waiters_do_not_need_a_timer() -> None:
    table = ResourceTable([sem("gpu", 1)], now=0)
    assert table.try_acquire({"gpu": 1}, 0) is None
    table.park("gpu", 1, 1)
    assert table.next_refill(0) is None


# ---------------------------------------------------------------------------------------------
# Token buckets


def test_token_bucket_refill_timing() -> None:
    s = NS_PER_S
    table = ResourceTable([bucket("api", 2.0, 3)], now=0)
    assert table.available("api", 0) == 3.0
    assert table.next_refill(0) is None

    # Drain it.
    assert table.try_acquire({"api": 3}, 0) is None
    assert table.available("api", 0) == 0.0
    assert table.try_acquire({"api": 1}, 0) == "api"
    table.park("api", 1, 1)
    table.park("api", 2, 2)
    table.park("api", 3, 1)

    # One token takes half a second at 2/s.
    assert table.next_refill(0) == s // 2
    assert table.next_refill(s // 4) == s // 2
    assert table.wake(s // 2 - 1) == []
    assert table.available("api", s // 2) == 1.0
    assert table.wake(s // 2) == [1]
    # Until task 1 shows up, its token is promised: waking again gives nothing more.
    assert table.wake(s // 2) == []
    assert table.next_refill(s // 2) == s + s // 2  # 1 promised + 2 for the head
    assert table.try_acquire({"api": 1}, s // 2, waiter=1) is None
    assert table.available("api", s // 2) == 0.0

    # The head now wants 2 tokens: one second more. The waiter behind it (1 token) would
    # fit sooner, but it is not woken ahead of the head.
    assert table.next_refill(s // 2) == s // 2 + s
    assert table.wake(s) == []
    assert table.wake(s // 2 + s) == [2]
    assert table.try_acquire({"api": 2}, s // 2 + s, waiter=2) is None

    assert table.next_refill(s // 2 + s) == 2 * s
    # Late wake: the bucket holds min(3, 2 * 5 s) = 3, so the last waiter fits too.
    assert table.wake(7 * s) == [3]
    assert table.next_refill(7 * s) is None
    assert table.available("api", 7 * s) == 3.0
    table.check_invariants()


def test_token_bucket_wakes_several_when_enough_tokens() -> None:
    s = NS_PER_S
    table = ResourceTable([bucket("api", 2.0, 3)], now=0)
    assert table.try_acquire({"api": 3}, 0) is None
    for task in (1, 2, 3, 4):
        table.park("api", task, 1)
    # 1.5 s refill 3 tokens: the first three waiters fit cumulatively, the fourth does not.
    assert table.wake(3 * s // 2) == [1, 2, 3]
    assert table.is_parked(4)
    # 3 promised + 1 more exceeds the burst: only the woken tasks can move this bucket on.
    assert table.next_refill(3 * s // 2) is None
    assert table.wake(10 * s) == []
    assert table.try_acquire({"api": 1}, 10 * s, waiter=1) is None
    # 2 tokens left, 2 still promised: the head fits once the bucket is full again.
    assert table.next_refill(10 * s) == 10 * s + s // 2
    assert table.try_acquire({"api": 1}, 10 * s, waiter=2) is None
    assert table.try_acquire({"api": 1}, 10 * s, waiter=3) is None
    assert table.next_refill(10 * s) == 10 * s + s // 2
    assert table.wake(10 * s + s // 2) == [4]


def test_refill_time_is_rounded_up() -> None:
    table = ResourceTable([bucket("api", 3.0, 1)], now=0)
    assert table.try_acquire({"api": 1}, 0) is None
    table.park("api", 1, 1)
    due = table.next_refill(0)
    assert due == 333_333_334  # 1/3 s, rounded up to whole nanoseconds
    assert table.available("api", due - 1) < 1.0 <= table.available("api", due)
    assert table.wake(due - 1) == []
    assert table.wake(due) == [1]


def test_refill_time_agrees_with_the_token_level_at_slow_rates() -> None:
    # At 1e-7 tokens/s the closed form is off by a few nanoseconds because of float
    # rounding; the time returned must still be the first at which the level suffices.
    table = ResourceTable([bucket("api", 1e-7, 3)], now=0)
    assert table.try_acquire({"api": 3}, 0) is None
    table.park("api", 1, 2)
    due = table.next_refill(0)
    assert due is not None
    assert table.available("api", due - 1) < 2.0 <= table.available("api", due)
    assert table.wake(due - 1) == []
    assert table.wake(due) == [1]


def test_next_refill_is_now_when_a_waiter_already_fits() -> None:
    table = ResourceTable([bucket("api", 1.0, 2)], now=0)
    assert table.try_acquire({"api": 2}, 0) is None
    table.park("api", 7, 1)
    assert table.next_refill(5 * NS_PER_S) == 5 * NS_PER_S


def test_next_refill_is_the_earliest_bucket() -> None:
    s = NS_PER_S
    table = ResourceTable([bucket("slow", 1.0, 1), bucket("fast", 4.0, 1)], now=0)
    assert table.try_acquire({"slow": 1, "fast": 1}, 0) is None
    table.park("slow", 1, 1)
    table.park("fast", 2, 1)
    assert table.next_refill(0) == s // 4
    assert table.wake(s // 4) == [2]
    assert table.next_refill(s // 4) == s


# ---------------------------------------------------------------------------------------------
# Unparking


def test_unpark_a_parked_waiter() -> None:
    table = ResourceTable([sem("gpu", 1), bucket("api", 1.0, 1)], now=0)
    assert table.try_acquire({"gpu": 1, "api": 1}, 0) is None
    table.park("gpu", 1, 1)
    table.park("gpu", 2, 1)
    table.park("gpu", 3, 1)
    table.park("api", 4, 1)
    assert table.unpark(2)
    assert not table.is_parked(2)
    assert not table.unpark(2)
    assert not table.unpark(99)
    assert table.parked_count() == 3
    table.check_invariants()

    # Parking the same task again puts it at the back, not at its old place.
    table.park("gpu", 2, 1)
    table.release({"gpu": 1}, 1)
    assert table.wake(1) == [1]
    assert table.try_acquire({"gpu": 1}, 1, waiter=1) is None
    table.release({"gpu": 1}, 2)
    assert table.wake(2) == [3]
    assert table.try_acquire({"gpu": 1}, 2, waiter=3) is None
    table.release({"gpu": 1}, 3)
    assert table.wake(3) == [2]

    # A cancelled bucket waiter no longer needs a timer.
    assert table.unpark(4)
    assert table.next_refill(3) is None
    assert table.wake(10 * NS_PER_S) == []
    table.check_invariants()


def test_many_unparks_keep_queues_compact() -> None:
    table = ResourceTable([sem("gpu", 1)], now=0)
    assert table.try_acquire({"gpu": 1}, 0) is None
    for task in range(1000):
        table.park("gpu", task, 1)
    for task in range(1, 999):
        assert table.unpark(task)
    table.check_invariants()
    table.release({"gpu": 1}, 1)
    assert table.wake(1) == [0]
    assert table.try_acquire({"gpu": 1}, 1, waiter=0) is None
    table.release({"gpu": 1}, 2)
    assert table.wake(2) == [999]
    assert table.parked_count() == 0


# ---------------------------------------------------------------------------------------------
# Property test: random operation sequences keep the books straight

CONFIGS = (sem("s1", 3), sem("s2", 2), bucket("b1", 2.0, 3), bucket("b2", 0.7, 2))
CAPACITY = {c.name: c.capacity for c in CONFIGS}
NAMES = tuple(CAPACITY)
BUCKETS = frozenset(c.name for c in CONFIGS if c.kind.value == "token_bucket")


@st.composite
def requests(draw: st.DrawFn) -> dict[str, int]:
    names = draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=3))
    return {n: draw(st.integers(1, CAPACITY[n])) for n in names}


@st.composite
def park_args(draw: st.DrawFn) -> tuple[str, int]:
    name = draw(st.sampled_from(NAMES))
    return name, draw(st.integers(1, CAPACITY[name]))


OPS = st.one_of(
    st.tuples(st.just("acquire"), st.tuples(requests(), st.booleans())),
    st.tuples(st.just("release"), st.integers(0, 50)),
    st.tuples(st.just("park"), park_args()),
    st.tuples(st.just("unpark"), st.integers(0, 50)),
    st.tuples(st.just("wake"), st.none()),
    st.tuples(st.just("advance"), st.integers(0, 2 * NS_PER_S)),
    st.tuples(st.just("refill"), st.none()),
    st.tuples(st.just("dispatch"), st.tuples(st.integers(0, 50), requests())),
    st.tuples(st.just("drop"), st.integers(0, 50)),
)


class Model:
    """Drives a table like the engine would and keeps its own books to compare with.

    Parked tasks sit in ``queues``; woken tasks wait in ``woken`` (task -> resource and
    amount it was woken for) until they are dispatched (try_acquire with their id, parking
    again on failure) or dropped (unpark). ``claims`` holds the open claims per resource,
    oldest first, with the units still promised to each.
    """

    def __init__(self) -> None:
        self.table = ResourceTable(CONFIGS, now=0)
        self.now = 0
        self.held: list[dict[str, int]] = []
        self.queues: dict[str, list[tuple[int, int]]] = {n: [] for n in NAMES}
        self.woken: dict[int, tuple[str, int]] = {}
        self.claims: dict[str, list[list[int]]] = {n: [] for n in NAMES}
        self.next_id = 0

    def snapshot(self) -> dict[str, float]:
        return {n: self.table.available(n, self.now) for n in NAMES}

    def promised(self, name: str) -> int:
        return sum(amount for _, amount in self.claims[name])

    def close_claim(self, task: int) -> None:
        for claims in self.claims.values():
            claims[:] = [c for c in claims if c[0] != task]

    def close_oldest(self, name: str, amount: int) -> None:
        claims = self.claims[name]
        while amount > 0 and claims:
            if claims[0][1] > amount:
                claims[0][1] -= amount
                return
            amount -= claims.pop(0)[1]

    def check_wake(self, woken: list[int], free: dict[str, float]) -> None:
        """``free`` is the level before the wake minus the units already promised."""
        assert len(woken) == len(set(woken))
        position = {task: i for i, task in enumerate(woken)}
        for name, queue in self.queues.items():
            mine = [task for task, _ in queue if task in position]
            # The woken waiters of a queue are its head, in order.
            assert mine == [task for task, _ in queue[: len(mine)]]
            assert sorted(position[t] for t in mine) == [position[t] for t in mine]
            taken = sum(amount for _, amount in queue[: len(mine)])
            assert taken <= max(free[name], 0.0) + 1e-9
            rest = queue[len(mine) :]
            # And nothing was left behind that fit.
            if rest:
                assert rest[0][1] > free[name] - taken
            for task, amount in queue[: len(mine)]:
                self.woken[task] = (name, amount)
                self.claims[name].append([task, amount])
            self.queues[name] = rest
        for task in woken:
            assert not self.table.is_parked(task)
            assert self.table.has_claim(task)

    def budgets(self) -> dict[str, float]:
        levels = self.snapshot()
        return {n: levels[n] - self.promised(n) for n in NAMES}

    def park(self, name: str, task: int, amount: int) -> None:
        self.table.park(name, task, amount)
        self.queues[name].append((task, amount))

    def acquire(self, req: dict[str, int], waiter: int | None) -> str | None:
        before = self.snapshot()
        short = self.table.try_acquire(req, self.now, waiter=waiter)
        after = self.snapshot()
        if waiter is not None:
            self.close_claim(waiter)
        if short is None:
            for name in NAMES:
                expected = before[name] - req.get(name, 0)
                assert after[name] == pytest.approx(expected, abs=1e-9)
            self.held.append(req)
            if waiter is None:
                for name, amount in req.items():
                    self.close_oldest(name, amount)
        else:
            assert req[short] > before[short]
            assert after == before
        return short

    def apply(self, op: str, arg: object) -> None:
        table = self.table
        if op == "acquire":
            # A task that was not woken, with or without its id.
            assert isinstance(arg, tuple)
            req, with_id = arg
            waiter = None
            if with_id:
                waiter = self.next_id
                self.next_id += 1
            self.acquire(req, waiter)
        elif op == "dispatch":
            assert isinstance(arg, tuple)
            index, extra = arg
            if self.woken:
                task = list(self.woken)[index % len(self.woken)]
                origin, amount = self.woken.pop(task)
                req = {**extra, origin: amount}
                short = self.acquire(req, task)
                assert not table.has_claim(task)
                if short is not None:
                    self.park(short, task, req[short])
        elif op == "drop":
            assert isinstance(arg, int)
            if self.woken:
                task = list(self.woken)[arg % len(self.woken)]
                del self.woken[task]
                self.close_claim(task)
                assert not table.unpark(task)
                assert not table.has_claim(task)
        elif op == "release":
            assert isinstance(arg, int)
            if self.held:
                req = self.held.pop(arg % len(self.held))
                before = self.snapshot()
                table.release(req, self.now)
                after = self.snapshot()
                for name in NAMES:
                    gain = 0 if name in BUCKETS else req.get(name, 0)
                    assert after[name] == before[name] + gain
        elif op == "park":
            assert isinstance(arg, tuple)
            name, amount = arg
            self.park(name, self.next_id, amount)
            self.next_id += 1
        elif op == "unpark":
            assert isinstance(arg, int)
            parked = [(n, i) for n, q in self.queues.items() for i in range(len(q))]
            if parked:
                name, i = parked[arg % len(parked)]
                task, _ = self.queues[name].pop(i)
                assert table.unpark(task)
                assert not table.unpark(task)
        elif op == "wake":
            free = self.budgets()
            self.check_wake(table.wake(self.now), free)
        elif op == "advance":
            assert isinstance(arg, int)
            self.now += arg
        elif op == "refill":
            due = table.next_refill(self.now)
            # Buckets whose head can be reached by refilling alone.
            reachable = [
                n for n in BUCKETS if self.queues[n] and self.promised(n) + self.queues[n][0][1] <= CAPACITY[n]
            ]
            if due is None:
                assert not reachable
            else:
                assert reachable and due >= self.now
                if due > self.now:
                    # Earliest: a nanosecond before, no bucket head fits yet.
                    for name in reachable:
                        level = table.available(name, due - 1)
                        assert level - self.promised(name) < self.queues[name][0][1]
                self.now = due
                free = self.budgets()
                woken = table.wake(self.now)
                assert woken
                self.check_wake(woken, free)
        else:  # pragma: no cover
            raise AssertionError(op)
        table.check_invariants()
        assert table.parked_count() == sum(len(q) for q in self.queues.values())
        for name in NAMES:
            assert table.promised(name) == self.promised(name)
            assert table.parked_count(name) == len(self.queues[name])
        open_claims = {c[0] for claims in self.claims.values() for c in claims}
        for task in self.woken:
            assert table.has_claim(task) == (task in open_claims)


@settings(max_examples=400, deadline=None)
@given(st.lists(OPS, max_size=80))
def test_random_operations_keep_invariants(ops: list[tuple[str, object]]) -> None:
    model = Model()
    for op, arg in ops:
        model.apply(op, arg)
