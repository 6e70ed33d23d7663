"""Shared resources: counting semaphores and token buckets, plus FIFO queues of parked tasks.

This module does no I/O and reads no clock: each call that depends on time takes ``now``
(int nanoseconds). It runs on the dispatch hot path, so the common cases are kept cheap: a
task without resources costs one truthiness test, and the state lives in slotted objects.

How the engine uses it:

* At submission, ``admission_error`` rejects unknown names, bad amounts and requests that
  could never fit (larger than a semaphore's permits or a bucket's burst).
* At dispatch, ``try_acquire`` takes every requested unit or none. When it names a short
  resource, the engine parks the task there with ``park``.
* At the end of an attempt, ``release`` gives semaphore units back (a bucket's tokens are
  spent for good; they come back only by refilling over time).
* ``wake`` hands back the parked tasks that the free units could now satisfy, in FIFO order
  per resource, without taking the units: the engine re-queues them and they call
  ``try_acquire`` again when they reach dispatch. ``next_refill`` says when a bucket with
  waiters will next have enough tokens, so the engine can set a timer and call ``wake`` then.

Claims. A woken task holds a *claim* on the units it was woken for until it shows up again:
``try_acquire(..., waiter=task)`` (whether it gets the units or not), ``park`` (anywhere) or
``unpark`` (cancelled, shed, ...). Claims do not reserve anything against ``try_acquire``: free
units go to whichever task the engine dispatches first, as priority order intends. They only
keep ``wake`` from promising the same units twice, and when a claim ends without the units
being taken, the queue it came from is looked at again so the waiter that was held back behind
it is not forgotten. The engine should therefore pass the task id to ``try_acquire`` and
call ``unpark`` for a task that leaves the waiting states without being dispatched. Without
the id, a successful ``try_acquire`` settles the oldest open claims on what it took, which is
right when woken tasks dispatch in the order they were woken; a claim that is never settled
keeps its units promised and holds back the queue behind it.

Token buckets refill continuously at ``rate`` units per second up to ``burst`` and start full.
Their level is a float computed on demand from the level and time of the last acquisition, so
reading a bucket never changes it and the same ``now`` always gives the same answer.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Final, cast

from .config import ResourceConfig, ResourceKind
from .types import NS_PER_S, ConfigError, SubmitCode

_NS_F: Final = float(NS_PER_S)
# Upper bound for a refill delay, so absurdly slow rates cannot overflow ``math.ceil``.
_MAX_DELAY: Final = 1 << 62


class _Waiter:
    """A parked task in one resource's queue, or (after wake) the claim of a woken task.

    A queue entry is live while the table's ``_parked`` map points at this very object;
    anything else in a queue is a stale leftover of an unparked task."""

    __slots__ = ("amount", "res", "task")

    def __init__(self, task: int, amount: int, res: _Resource) -> None:
        self.task = task
        self.amount = amount
        self.res = res


class _Resource:
    """State of one resource. Semaphores use ``permits``/``used``; token buckets use
    ``rate``/``burst``/``tokens``/``stamp``. Both share the waiter queue."""

    __slots__ = (
        "bucket",
        "burst",
        "capacity",
        "charge",
        "claimq",
        "live",
        "name",
        "nclaims",
        "permits",
        "queue",
        "rate",
        "stamp",
        "tokens",
        "used",
    )

    def __init__(self, config: ResourceConfig, now: int) -> None:
        self.name = config.name
        self.bucket = config.kind is ResourceKind.TOKEN_BUCKET
        self.capacity = config.capacity
        self.permits = config.permits
        self.used = 0
        self.rate = float(config.rate)
        self.burst = float(config.burst)
        self.tokens = float(config.burst)
        self.stamp = now
        self.queue: deque[_Waiter] = deque()
        self.live = 0
        # Open claims of tasks woken from this queue, oldest first (stale entries are skipped),
        # their number, and the units they were promised.
        self.claimq: deque[_Waiter] = deque()
        self.nclaims = 0
        self.charge = 0


def _tokens_at(res: _Resource, now: int) -> float:
    """Level of a token bucket at ``now``; a pure function of the stored level and stamp."""
    elapsed = now - res.stamp
    if elapsed <= 0:
        return res.tokens
    level = res.tokens + elapsed * res.rate / _NS_F
    return level if level < res.burst else res.burst


def _refill_time(res: _Resource, need: float, now: int) -> int:
    """Earliest integer ns ``t >= now`` at which ``_tokens_at(res, t) >= need``.

    The closed form is rounded up, then nudged until it agrees with ``_tokens_at``, so a
    timer set for the returned time always finds the tokens there. Float rounding only moves
    the closed form at very slow rates (about 1e-7 tokens/s and below); there the result may
    still be a few ns later than the true earliest time, never earlier. A bucket so slow that
    the tokens are more than 2**62 ns away gets that far-off time instead, to be looked at again.
    """
    if _tokens_at(res, now) >= need:
        return now
    delay = (need - res.tokens) * _NS_F / res.rate
    if not delay < _MAX_DELAY:
        # So slow a bucket refills past any horizon worth a timer: look again then, without
        # searching (the search below would double ``t`` until the float arithmetic overflows).
        return max(res.stamp, now) + _MAX_DELAY
    t = res.stamp + math.ceil(delay)
    if t <= now:
        t = now + 1
    step = 1
    while _tokens_at(res, t) < need:
        t += step
        step *= 2
    # The closed form may also overshoot by a nanosecond or two; step back if so.
    for _ in range(2):
        if t - 1 > now and _tokens_at(res, t - 1) >= need:
            t -= 1
        else:
            break
    return t


class ResourceTable:
    """Every configured resource of one scheduler (or shard), with its parked waiters.

    Names passed to ``try_acquire``, ``release``, ``park``, ``available`` and ``in_use``
    must be configured (``admission_error`` screens submissions); others raise ``KeyError``.
    """

    __slots__ = ("_by_name", "_claims", "_dirty", "_parked", "_waiting_buckets")

    def __init__(self, configs: Sequence[ResourceConfig], now: int) -> None:
        self._by_name: dict[str, _Resource] = {}
        for config in configs:
            if config.name in self._by_name:
                raise ConfigError(f"duplicate resource name {config.name!r}")
            self._by_name[config.name] = _Resource(config, now)
        # Live waiters by task id.
        self._parked: dict[int, _Waiter] = {}
        # Open claims of woken tasks by task id (at most one per task).
        self._claims: dict[int, _Waiter] = {}
        # Semaphores to look at on the next wake (units returned, or the queue changed).
        # Dicts serve as insertion-ordered sets so that wake order is deterministic.
        self._dirty: dict[_Resource, None] = {}
        # Token buckets that have live waiters; they become due as time passes.
        self._waiting_buckets: dict[_Resource, None] = {}

    # -----------------------------------------------------------------------------------------
    # Admission

    def admission_error(self, requests: Mapping[str, int]) -> tuple[SubmitCode, str] | None:
        """Why a task requesting ``requests`` must be refused at submission, or None."""
        # Read as the caller may really have built it: compiled by mypyc, a typed read would raise
        # a bare TypeError on a wrongly typed entry before it could be refused by name.
        unchecked = cast("Mapping[object, object]", requests)
        for name, amount in unchecked.items():
            res = self._by_name.get(name) if isinstance(name, str) else None
            if res is None:
                return SubmitCode.UNKNOWN_RESOURCE, f"unknown resource {name!r}"
            if not isinstance(amount, int) or isinstance(amount, bool) or amount < 1:
                return (
                    SubmitCode.INVALID,
                    f"resource {name!r}: the amount must be a positive integer, not {amount!r}",
                )
            if amount > res.capacity:
                what = "burst" if res.bucket else "permits"
                return (
                    SubmitCode.RESOURCE_EXCEEDS_CAPACITY,
                    f"resource {name!r}: {amount} units requested but its {what} is {res.capacity}",
                )
        return None

    # -----------------------------------------------------------------------------------------
    # Acquisition

    def try_acquire(self, requests: Mapping[str, int], now: int, waiter: int | None = None) -> str | None:
        """Take all of ``requests`` and return None, or take nothing and return the name of
        a resource that does not have enough units right now.

        ``waiter`` is the task's id; it settles the claim the task got if ``wake`` woke it.
        Without it, a successful acquisition settles the oldest open claims on each resource
        it takes from, up to the units taken (a fallback that guesses who was served).
        """
        if not requests:
            if waiter is not None and self._claims:
                self._settle(waiter, None)
            return None
        if len(requests) == 1:
            # The common case, in one pass.
            for name, amount in requests.items():
                res = self._by_name[name]
                if res.bucket:
                    level = _tokens_at(res, now)
                    if level < amount:
                        break
                    res.tokens = level - amount
                    if now > res.stamp:
                        res.stamp = now
                elif res.permits - res.used < amount:
                    break
                else:
                    res.used += amount
                if self._claims:
                    if waiter is None:
                        if res.charge:
                            self._settle_oldest(res, amount)
                    else:
                        self._settle(waiter, requests)
                return None
            if waiter is not None and self._claims:
                self._settle(waiter, None)
            return name
        table = self._by_name
        for name, amount in requests.items():
            res = table[name]
            if res.bucket:
                if _tokens_at(res, now) < amount:
                    break
            elif res.permits - res.used < amount:
                break
        else:
            for name, amount in requests.items():
                res = table[name]
                if res.bucket:
                    res.tokens = _tokens_at(res, now) - amount
                    if now > res.stamp:
                        res.stamp = now
                else:
                    res.used += amount
                if res.charge and waiter is None:
                    self._settle_oldest(res, amount)
            if waiter is not None and self._claims:
                self._settle(waiter, requests)
            return None
        if waiter is not None and self._claims:
            self._settle(waiter, None)
        return name

    def release(self, requests: Mapping[str, int], now: int) -> None:
        """Give back the semaphore units of a finished attempt; bucket tokens stay spent.

        Releasing more than was taken is a caller bug that ``check_invariants`` reports.
        """
        if not requests:
            return
        table = self._by_name
        for name, amount in requests.items():
            res = table[name]
            if not res.bucket:
                res.used -= amount
                if res.live:
                    self._dirty[res] = None

    def _settle(self, task: int, taken: Mapping[str, int] | None) -> None:
        """End the open claim of ``task``, if any; ``taken`` is what the task just acquired.

        Unless the claimed units were among them, they may now satisfy a waiter that wake
        held back, so the semaphore is looked at again (buckets are on every wake anyway).
        """
        claim = self._claims.pop(task, None)
        if claim is None:
            return
        res = claim.res
        res.charge -= claim.amount
        res.nclaims -= 1
        if not res.nclaims:
            res.claimq.clear()
        elif len(res.claimq) > 2 * res.nclaims + 8:
            claims = self._claims
            res.claimq = deque(c for c in res.claimq if claims.get(c.task) is c)
        if res.live and not res.bucket and (taken is None or taken.get(res.name, 0) < claim.amount):
            self._dirty[res] = None

    def _settle_oldest(self, res: _Resource, amount: int) -> None:
        """Count ``amount`` units just taken from ``res`` by an anonymous caller against the
        oldest open claims on it (the last one possibly in part)."""
        queue = res.claimq
        claims = self._claims
        while amount > 0 and queue:
            claim = queue[0]
            if claims.get(claim.task) is not claim:
                queue.popleft()
                continue
            if claim.amount > amount:
                claim.amount -= amount
                res.charge -= amount
                return
            amount -= claim.amount
            res.charge -= claim.amount
            res.nclaims -= 1
            del claims[claim.task]
            queue.popleft()

    # -----------------------------------------------------------------------------------------
    # Parking

    def park(self, name: str, waiter: int, amount: int, front: bool = False) -> None:
        """Append ``waiter`` (a task id) wanting ``amount`` units to the queue of ``name``.

        ``front`` puts it at the head instead: a task that was woken and then lost the units to
        a more urgent task keeps its place ahead of later waiters.
        """
        if waiter in self._parked:
            raise ValueError(f"task {waiter} is already parked")
        res = self._by_name[name]
        if not 1 <= amount <= res.capacity:
            # Such a waiter could never be woken (and a bucket could never be due for it).
            raise ValueError(f"resource {name!r}: cannot park a request of {amount} units")
        if self._claims:
            self._settle(waiter, None)
        entry = _Waiter(waiter, amount, res)
        if not res.live:
            # A new head. After a failed try_acquire it cannot fit, but checking costs little
            # and covers a caller that parks a task which could run.
            res.queue.clear()
            if res.bucket:
                self._waiting_buckets[res] = None
            else:
                self._dirty[res] = None
        if front:
            res.queue.appendleft(entry)
            if res.bucket:
                self._waiting_buckets[res] = None
            else:
                self._dirty[res] = None
        else:
            res.queue.append(entry)
        res.live += 1
        self._parked[waiter] = entry

    def unpark(self, waiter: int) -> bool:
        """Take ``waiter`` out of whichever queue holds it, and end its claim if wake woke it.

        Returns True if it was parked. Call it for any task that stops waiting without being
        dispatched (cancelled, shed, ...), parked or not. The queue entry is left in place and
        skipped later; a queue is compacted once most of it is stale, so this is O(1) amortized.
        """
        if self._claims:
            self._settle(waiter, None)
        entry = self._parked.pop(waiter, None)
        if entry is None:
            return False
        res = entry.res
        res.live -= 1
        if res.live == 0:
            res.queue.clear()
            self._waiting_buckets.pop(res, None)
            self._dirty.pop(res, None)
            return True
        if len(res.queue) > 2 * res.live + 8:
            parked = self._parked
            res.queue = deque(w for w in res.queue if parked.get(w.task) is w)
        if not res.bucket:
            # The removed waiter may have been the head that held back smaller ones.
            self._dirty[res] = None
        return True

    def is_parked(self, waiter: int) -> bool:
        return waiter in self._parked

    def parked_count(self, name: str | None = None) -> int:
        """Live waiters on resource ``name``, or on all resources when ``name`` is None."""
        if name is None:
            return len(self._parked)
        return self._by_name[name].live

    # -----------------------------------------------------------------------------------------
    # Waking

    def wake(self, now: int) -> list[int]:
        """Unpark and return the waiters that the free units can satisfy now.

        Per resource, waiters leave from the head of the queue while their amounts, added to
        the units already promised to earlier woken tasks, fit in the free units; the first
        that does not fit stops that queue, so no one overtakes it. Nothing is taken: each
        woken task gets a claim instead (see the module notes). Semaphores are examined only
        if something changed since the last wake (units returned, a claim ended, the head
        left); buckets with waiters are examined every time, since tokens refill with time.
        """
        woken: list[int] = []
        if self._dirty:
            dirty = self._dirty
            self._dirty = {}
            for res in dirty:
                if res.live:
                    self._pop_fitting(res, float(res.permits - res.used - res.charge), woken)
        if self._waiting_buckets:
            drained: list[_Resource] = []
            for res in self._waiting_buckets:
                self._pop_fitting(res, _tokens_at(res, now) - res.charge, woken)
                if not res.live:
                    drained.append(res)
            for res in drained:
                del self._waiting_buckets[res]
        return woken

    def _pop_fitting(self, res: _Resource, free: float, out: list[int]) -> None:
        queue = res.queue
        parked = self._parked
        claims = self._claims
        while queue:
            entry = queue[0]
            if parked.get(entry.task) is not entry:
                queue.popleft()
                continue
            if entry.amount > free:
                return
            free -= entry.amount
            queue.popleft()
            del parked[entry.task]
            res.live -= 1
            claims[entry.task] = entry
            res.claimq.append(entry)
            res.nclaims += 1
            res.charge += entry.amount
            out.append(entry.task)

    def next_refill(self, now: int) -> int | None:
        """When (int ns, rounded up, never before ``now``) the first token bucket with
        waiters will hold enough tokens for its head waiter, on top of the tokens promised to
        tasks it already woke; ``now`` means a wake would already wake someone.

        None when no bucket can get there by refilling alone: no bucket has waiters, or the
        promised tokens plus the head's request exceed the burst (that bucket moves on when
        its woken tasks take their tokens or give up their claims). Any call can move this
        time, so ask again after each step.
        """
        best: int | None = None
        parked = self._parked
        for res in self._waiting_buckets:
            queue = res.queue
            while queue and parked.get(queue[0].task) is not queue[0]:
                queue.popleft()
            if not queue:
                continue
            need = res.charge + queue[0].amount
            if need > res.burst:
                continue
            due = _refill_time(res, float(need), now)
            if best is None or due < best:
                best = due
        return best

    # -----------------------------------------------------------------------------------------
    # Introspection

    def names(self) -> list[str]:
        return list(self._by_name)

    def available(self, name: str, now: int) -> float:
        """Free permits of a semaphore, or the token level of a bucket at ``now``."""
        res = self._by_name[name]
        if res.bucket:
            return _tokens_at(res, now)
        return float(res.permits - res.used)

    def in_use(self, name: str) -> int:
        """Permits held of a semaphore; always 0 for a token bucket (nothing is held)."""
        res = self._by_name[name]
        return 0 if res.bucket else res.used

    def promised(self, name: str) -> int:
        """Units that wake promised to woken tasks whose claims are still open."""
        return self._by_name[name].charge

    def has_claim(self, waiter: int) -> bool:
        return waiter in self._claims

    def check_invariants(self) -> None:
        """Raise AssertionError if any count is out of range or the waiter books disagree."""
        live_total = 0
        charges = {res: 0 for res in self._by_name.values()}
        counts = dict.fromkeys(self._by_name.values(), 0)
        for task, claim in self._claims.items():
            if task in self._parked:
                raise AssertionError(f"task {task} is parked and holds a claim")
            if claim.amount < 1 or claim not in claim.res.claimq:
                raise AssertionError(f"task {task}: claim of {claim.amount} is out of its queue")
            charges[claim.res] += claim.amount
            counts[claim.res] += 1
        for res in self._by_name.values():
            if res.bucket:
                if not 0.0 <= res.tokens <= res.burst:
                    raise AssertionError(f"bucket {res.name!r}: {res.tokens} tokens outside [0, {res.burst}]")
            elif not 0 <= res.used <= res.permits:
                raise AssertionError(f"semaphore {res.name!r}: {res.used} of {res.permits} permits in use")
            if res.nclaims != counts[res]:
                raise AssertionError(f"resource {res.name!r}: {counts[res]} open claims, counted {res.nclaims}")
            if res.charge != charges[res]:
                raise AssertionError(f"resource {res.name!r}: {res.charge} promised, claims add up to {charges[res]}")
            live = sum(1 for w in res.queue if self._parked.get(w.task) is w)
            if live != res.live:
                raise AssertionError(f"resource {res.name!r}: {live} live waiters, counted {res.live}")
            if res.bucket and (res.live > 0) != (res in self._waiting_buckets):
                raise AssertionError(f"bucket {res.name!r}: waiting set out of date")
            live_total += live
        if live_total != len(self._parked):
            raise AssertionError(f"{len(self._parked)} parked tasks but {live_total} in queues")
