"""Cheap statistics for the hot path: a log-linear histogram, an EWMA and a sliding metrics window.

Everything here is sans-IO: callers pass the current time (int ns) explicitly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = ["Ewma", "LogLinearHistogram", "MetricsWindow", "WindowBucket"]

# Histogram layout. Values below ``_LINEAR_LIMIT`` get one bucket each (exact). Above it, every
# power-of-two range [2**k, 2**(k+1)) is cut into ``_SUB`` equal sub-buckets, so a bucket is at most
# 1/8 of its lower bound wide and its midpoint is within 6.25% of any value it holds.
_SUB_BITS = 3
_SUB = 1 << _SUB_BITS  # 8 sub-buckets per power of two
_LINEAR_LIMIT = _SUB << 1  # 16: below this every integer has its own bucket
_SHIFT_BASE = _SUB_BITS + 1  # bit_length() of _LINEAR_LIMIT - 1


def _bucket_index(value: int) -> int:
    """Bucket index of a non-negative value (mirrors the inlined code in ``record``)."""
    if value < _LINEAR_LIMIT:
        return value if value > 0 else 0
    shift = value.bit_length() - _SHIFT_BASE
    return (shift << _SUB_BITS) + (value >> shift)


def _bucket_bounds(index: int) -> tuple[int, int]:
    """The half-open value range [low, high) that bucket ``index`` covers."""
    if index < _LINEAR_LIMIT:
        return index, index + 1
    shift = (index >> _SUB_BITS) - 1
    low = ((index & (_SUB - 1)) | _SUB) << shift
    return low, low + (1 << shift)


def _bucket_mid(index: int) -> int:
    """Representative value of a bucket: its lower bound plus half its width."""
    low, high = _bucket_bounds(index)
    return low + ((high - low) >> 1)


def _rank(q: float, count: int) -> int:
    """1-based nearest rank of quantile ``q`` among ``count`` values."""
    if not q > 0.0:  # also catches NaN
        return 1
    if q >= 1.0:
        return count
    # Rounding first keeps products like 0.07 * 100 = 7.000000000000001 from jumping a rank.
    rank = math.ceil(round(q * count, 9))
    return 1 if rank < 1 else rank


class LogLinearHistogram:
    """Counts of non-negative ints in log-linear buckets (relative resolution about 1/8).

    ``quantile`` returns the midpoint of the bucket holding the nearest-rank quantile, so it is
    within 6.25% of the true nearest-rank quantile (exact below 16). ``mean`` is exact. Negative
    values are recorded as 0. Buckets live in a dict keyed by bucket index (sparse).
    """

    __slots__ = ("_buckets", "count", "total")

    def __init__(self) -> None:
        self._buckets: dict[int, int] = {}
        self.count: int = 0
        self.total: int = 0

    def record(self, value: int) -> None:
        if value < _LINEAR_LIMIT:
            if value < 0:
                value = 0
            index = value
        else:
            shift = value.bit_length() - _SHIFT_BASE
            index = (shift << _SUB_BITS) + (value >> shift)
        buckets = self._buckets
        buckets[index] = buckets.get(index, 0) + 1
        self.count += 1
        self.total += value

    def merge(self, other: LogLinearHistogram) -> None:
        if not other.count:
            return
        buckets = self._buckets
        get = buckets.get
        for index, n in other._buckets.items():
            buckets[index] = get(index, 0) + n
        self.count += other.count
        self.total += other.total

    def quantile(self, q: float) -> int:
        """Approximate nearest-rank quantile, ``q`` in [0, 1]; 0 when empty."""
        if not self.count:
            return 0
        return self.quantiles((q,))[0]

    def quantiles(self, qs: Iterable[float]) -> list[int]:
        """Several quantiles for the cost of one pass over the non-empty buckets."""
        wanted = list(qs)
        if not self.count:
            return [0] * len(wanted)
        order = sorted(range(len(wanted)), key=wanted.__getitem__)
        out = [0] * len(wanted)
        buckets = self._buckets
        keys = sorted(buckets)
        pos = 0
        seen = 0
        for slot in order:
            rank = _rank(wanted[slot], self.count)
            # rank <= count == sum of all buckets, so this stops before running out of keys.
            while seen < rank:
                seen += buckets[keys[pos]]
                pos += 1
            out[slot] = _bucket_mid(keys[pos - 1])
        return out

    def subtract(self, other: LogLinearHistogram) -> None:
        """Remove values recorded in ``other`` (which must be a subset of this histogram)."""
        if not other.count:
            return
        buckets = self._buckets
        for index, n in other._buckets.items():
            left = buckets.get(index, 0) - n
            if left > 0:
                buckets[index] = left
            else:
                buckets.pop(index, None)
        self.count = max(0, self.count - other.count)
        self.total = max(0, self.total - other.total)

    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0

    def clear(self) -> None:
        if self.count:
            self._buckets.clear()
            self.count = 0
            self.total = 0

    def copy(self) -> LogLinearHistogram:
        dup = LogLinearHistogram()
        dup._buckets = self._buckets.copy()
        dup.count = self.count
        dup.total = self.total
        return dup

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        return f"LogLinearHistogram(count={self.count}, mean={self.mean():.1f})"


class Ewma:
    """Exponentially weighted moving average; the first sample sets the value."""

    __slots__ = ("alpha", "value")

    def __init__(self, alpha: float) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError("alpha must be within (0, 1]")
        self.alpha = alpha
        self.value: float | None = None

    def update(self, sample: float) -> float:
        current = self.value
        value = sample if current is None else current + self.alpha * (sample - current)
        self.value = value
        return value


_COUNTERS = (
    "dispatched",
    "succeeded",
    "failed",
    "retried",
    "inversions",
    "fixed_hits",
    "fixed_total",
    "objective_met",
    "objective_total",
    "busy_ns",
    "capacity_ns",
)


class WindowBucket:
    """Counters and histograms for one slice of a metrics window (or a merge of several).

    ``busy_ns`` and ``capacity_ns`` are slot-nanosecond integrals (slots x time).
    """

    __slots__ = (
        "busy_ns",
        "capacity_ns",
        "dispatched",
        "failed",
        "fixed_hits",
        "fixed_run",
        "fixed_total",
        "inversions",
        "objective_met",
        "objective_total",
        "retried",
        "run",
        "succeeded",
        "wait",
    )

    def __init__(self) -> None:
        self.dispatched = 0
        self.succeeded = 0
        self.failed = 0
        self.retried = 0
        self.inversions = 0
        self.fixed_hits = 0
        self.fixed_total = 0
        self.objective_met = 0
        self.objective_total = 0
        self.busy_ns = 0
        self.capacity_ns = 0
        self.wait = LogLinearHistogram()
        self.run = LogLinearHistogram()
        self.fixed_run = LogLinearHistogram()

    def clear(self) -> None:
        self.dispatched = 0
        self.succeeded = 0
        self.failed = 0
        self.retried = 0
        self.inversions = 0
        self.fixed_hits = 0
        self.fixed_total = 0
        self.objective_met = 0
        self.objective_total = 0
        self.busy_ns = 0
        self.capacity_ns = 0
        self.wait.clear()
        self.run.clear()
        self.fixed_run.clear()

    def merge_into(self, target: WindowBucket) -> None:
        target.dispatched += self.dispatched
        target.succeeded += self.succeeded
        target.failed += self.failed
        target.retried += self.retried
        target.inversions += self.inversions
        target.fixed_hits += self.fixed_hits
        target.fixed_total += self.fixed_total
        target.objective_met += self.objective_met
        target.objective_total += self.objective_total
        target.busy_ns += self.busy_ns
        target.capacity_ns += self.capacity_ns
        target.wait.merge(self.wait)
        target.run.merge(self.run)
        target.fixed_run.merge(self.fixed_run)

    @property
    def utilization(self) -> float:
        """busy / capacity over the bucket's time; 0.0 when there was no capacity."""
        return self.busy_ns / self.capacity_ns if self.capacity_ns > 0 else 0.0

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)}" for name in _COUNTERS)
        return f"WindowBucket({fields})"


class MetricsWindow:
    """A sliding window of ``window`` ns kept as a ring of ``buckets`` equal slices.

    Slice ``n`` covers [start + n*width, start + (n+1)*width) with ``width = window // buckets``.
    The ring holds the slice containing the latest time seen (the head) and the ``buckets - 1``
    slices before it; older slices are cleared as time moves on. Time is expected not to go
    backwards; an earlier ``now`` is treated as belonging to the head slice.
    """

    __slots__ = (
        "_busy",
        "_capacity",
        "_head",
        "_head_bucket",
        "_head_end",
        "_last",
        "_ring",
        "buckets",
        "start",
        "width",
        "window",
    )

    def __init__(self, window: int, buckets: int = 12, start: int = 0) -> None:
        if window <= 0:
            raise ValueError("window must be positive")
        if buckets <= 0:
            raise ValueError("buckets must be positive")
        self.window = window
        self.buckets = buckets
        self.width = max(1, window // buckets)
        self.start = start
        self._ring = [WindowBucket() for _ in range(buckets)]
        self._head = 0
        self._head_bucket = self._ring[0]
        self._head_end = start + self.width
        self._last = start  # time up to which busy/capacity have been integrated
        self._busy = 0  # levels passed to the latest integrate() call
        self._capacity = 0

    def current(self, now: int) -> WindowBucket:
        """The bucket that events at ``now`` belong to (rotating the ring if needed)."""
        if now < self._head_end:
            return self._head_bucket
        return self._advance(now)

    def _advance(self, now: int) -> WindowBucket:
        width = self.width
        target = (now - self.start) // width
        ring = self._ring
        size = self.buckets
        head = self._head
        if target - head >= size:
            for bucket in ring:
                bucket.clear()
        else:
            for n in range(head + 1, target + 1):
                ring[n % size].clear()
        self._head = target
        bucket = ring[target % size]
        self._head_bucket = bucket
        self._head_end = self.start + (target + 1) * width
        return bucket

    def integrate(self, now: int, busy: int, capacity: int) -> None:
        """Add ``busy`` and ``capacity`` slot-time for [previous integrate time, now).

        Call it with the levels that held since the previous call, right before they change.
        Time is split exactly between the slices it crosses; time older than the ring is dropped.
        """
        self._busy = busy
        self._capacity = capacity
        last = self._last
        if now <= last:
            return
        self._last = now
        if now < self._head_end and last >= self._head_end - self.width:
            # Common case: the whole interval lies in the head slice.
            bucket = self._head_bucket
            dt = now - last
            bucket.busy_ns += busy * dt
            bucket.capacity_ns += capacity * dt
            return
        # ``now`` itself is an exclusive bound; rotate so the slice holding now - 1 is the head.
        self.current(now - 1)
        width = self.width
        start = self.start
        oldest = start + (self._head - self.buckets + 1) * width
        t = last if last > oldest else oldest
        ring = self._ring
        size = self.buckets
        while t < now:
            n = (t - start) // width
            end = start + (n + 1) * width
            if end > now:
                end = now
            dt = end - t
            bucket = ring[n % size]
            bucket.busy_ns += busy * dt
            bucket.capacity_ns += capacity * dt
            t = end

    def integrate_current(self, now: int, busy: int, capacity: int) -> WindowBucket:
        """``integrate(now, busy, capacity)`` then ``current(now)``, in one call (every attempt
        that starts or ends does both)."""
        head_end = self._head_end
        last = self._last
        if now < head_end and (now <= last or last >= head_end - self.width):
            self._busy = busy
            self._capacity = capacity
            bucket = self._head_bucket
            if now > last:
                self._last = now
                dt = now - last
                bucket.busy_ns += busy * dt
                bucket.capacity_ns += capacity * dt
            return bucket
        self.integrate(now, busy, capacity)
        return self.current(now)

    def totals(self, now: int, busy: int | None = None, capacity: int | None = None) -> WindowBucket:
        """A fresh bucket merging the whole window as of ``now``.

        Busy and capacity are first integrated up to ``now`` using the given levels, or, when they
        are omitted, the levels passed to the latest ``integrate`` call.
        """
        self.integrate(
            now,
            self._busy if busy is None else busy,
            self._capacity if capacity is None else capacity,
        )
        self.current(now)
        merged = WindowBucket()
        for bucket in self._ring:
            bucket.merge_into(merged)
        return merged

    def span(self, now: int) -> int:
        """Time the window covers at ``now``: from the start of the oldest live slice (or from
        ``start``, early on) to ``now``; never more than ``window``."""
        if now <= self.start:
            return 0
        head = (now - self.start) // self.width
        if head < self._head:
            head = self._head
        oldest = self.start + (head - self.buckets + 1) * self.width
        covered = now - (oldest if oldest > self.start else self.start)
        return max(0, min(covered, self.window))
