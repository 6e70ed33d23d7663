from __future__ import annotations

import math
import random

from cronoq.engine.stats import (
    Ewma,
    LogLinearHistogram,
    MetricsWindow,
    WindowBucket,
    _bucket_bounds,
    _bucket_index,
)
from cronoq.engine.types import NS_PER_MS, NS_PER_S
from hypothesis import given, settings
from hypothesis import strategies as st

TOLERANCE = 0.09


def exact_quantile(values: list[int], q: float) -> int:
    ordered = sorted(values)
    rank = 1 if q <= 0 else len(ordered) if q >= 1 else max(1, math.ceil(round(q * len(ordered), 9)))
    return ordered[rank - 1]


def close(estimate: int, exact: int) -> bool:
    return abs(estimate - exact) <= TOLERANCE * exact


# -- LogLinearHistogram ---------------------------------------------------------------------------


def test_empty_histogram() -> None:
    h = LogLinearHistogram()
    assert h.count == 0
    assert h.total == 0
    assert h.quantile(0.5) == 0
    assert h.quantiles([0.5, 0.99]) == [0, 0]
    assert h.mean() == 0.0


def test_small_values_are_exact() -> None:
    h = LogLinearHistogram()
    for v in range(16):
        h.record(v)
    assert h.quantile(0.0) == 0
    assert h.quantile(1.0) == 15
    assert h.quantile(0.5) == 7  # rank ceil(0.5 * 16) = 8 -> value 7
    assert h.mean() == sum(range(16)) / 16


def test_negative_values_count_as_zero() -> None:
    h = LogLinearHistogram()
    h.record(-5)
    assert h.count == 1
    assert h.total == 0
    assert h.quantile(0.5) == 0


def test_bucket_layout_is_contiguous_and_narrow() -> None:
    previous_high = 0
    for index in range(0, 400):
        low, high = _bucket_bounds(index)
        assert low == previous_high
        assert high > low
        if low >= 16:
            assert (high - low) * 8 <= low
        assert _bucket_index(low) == index
        assert _bucket_index(high - 1) == index
        previous_high = high


def test_record_matches_bucket_index() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        v = rng.randrange(0, 1 << rng.randrange(1, 64))
        h = LogLinearHistogram()
        h.record(v)
        assert list(h._buckets) == [_bucket_index(v)]


def test_uniform_distribution_quantiles() -> None:
    h = LogLinearHistogram()
    values = list(range(1, 10_001))  # 1 .. 10000 ms
    for v in values:
        h.record(v * NS_PER_MS)
    for q, expected_ms in ((0.5, 5000), (0.9, 9000), (0.99, 9900), (1.0, 10_000)):
        est = h.quantile(q)
        assert close(est, expected_ms * NS_PER_MS), (q, est)
    assert h.mean() == 5000.5 * NS_PER_MS
    assert h.count == 10_000


def test_exponential_distribution_quantiles() -> None:
    rng = random.Random(42)
    values = [int(rng.expovariate(1 / 0.2) * NS_PER_S) for _ in range(20_000)]
    h = LogLinearHistogram()
    for v in values:
        h.record(v)
    for q in (0.1, 0.5, 0.9, 0.99, 0.999):
        assert close(h.quantile(q), exact_quantile(values, q)), q
    # Exact p50 of Exp(mean 0.2 s) is 0.2 * ln 2 = 0.1386 s.
    assert abs(h.quantile(0.5) / NS_PER_S - 0.1386) < 0.02


def test_quantiles_matches_single_calls() -> None:
    h = LogLinearHistogram()
    for v in (5, 50, 500, 5000, 50_000, 500_000):
        h.record(v)
    qs = [0.99, 0.1, 0.5, 0.0]
    assert h.quantiles(qs) == [h.quantile(q) for q in qs]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=10**13), min_size=1, max_size=300),
    st.floats(min_value=0.0, max_value=1.0),
)
def test_quantile_within_resolution(values: list[int], q: float) -> None:
    h = LogLinearHistogram()
    for v in values:
        h.record(v)
    assert close(h.quantile(q), exact_quantile(values, q))
    assert h.mean() == sum(values) / len(values)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=10**12), max_size=100),
    st.lists(st.integers(min_value=0, max_value=10**12), max_size=100),
)
def test_merge_equals_recording_everything(a: list[int], b: list[int]) -> None:
    ha, hb, both = LogLinearHistogram(), LogLinearHistogram(), LogLinearHistogram()
    for v in a:
        ha.record(v)
        both.record(v)
    for v in b:
        hb.record(v)
        both.record(v)
    ha.merge(hb)
    assert ha.count == both.count
    assert ha.total == both.total
    assert ha._buckets == both._buckets


def test_copy_and_clear() -> None:
    h = LogLinearHistogram()
    for v in (10, 1000, 100_000):
        h.record(v)
    dup = h.copy()
    h.clear()
    assert h.count == 0 and h.total == 0 and h.quantile(0.5) == 0
    assert dup.count == 3 and dup.total == 101_010
    assert close(dup.quantile(1.0), 100_000)
    dup.record(1)
    assert h.count == 0


# -- Ewma -----------------------------------------------------------------------------------------


def test_ewma() -> None:
    e = Ewma(0.3)
    assert e.value is None
    assert e.update(10.0) == 10.0
    assert math.isclose(e.update(20.0), 13.0)
    assert math.isclose(e.update(0.0), 9.1)
    assert e.value is not None and math.isclose(e.value, 9.1)


# -- WindowBucket ---------------------------------------------------------------------------------


def test_window_bucket_merge_and_clear() -> None:
    a, b = WindowBucket(), WindowBucket()
    a.dispatched, a.succeeded, a.failed, a.retried = 3, 2, 1, 1
    a.inversions, a.fixed_hits, a.fixed_total = 1, 1, 2
    a.objective_met, a.objective_total = 4, 5
    a.busy_ns, a.capacity_ns = 10, 20
    a.wait.record(100)
    a.run.record(200)
    a.fixed_run.record(300)
    b.dispatched = 7
    b.busy_ns = 5
    a.merge_into(b)
    assert b.dispatched == 10
    assert (b.succeeded, b.failed, b.retried, b.inversions) == (2, 1, 1, 1)
    assert (b.fixed_hits, b.fixed_total, b.objective_met, b.objective_total) == (1, 2, 4, 5)
    assert (b.busy_ns, b.capacity_ns) == (15, 20)
    assert (b.wait.count, b.run.count, b.fixed_run.count) == (1, 1, 1)
    a.clear()
    assert a.dispatched == 0 and a.busy_ns == 0 and a.wait.count == 0 and a.objective_total == 0
    assert b.wait.count == 1


# -- MetricsWindow --------------------------------------------------------------------------------

S = NS_PER_S
T0 = 1_700_000_000 * S  # a realistic epoch-based start


def test_current_rotates_and_expires() -> None:
    w = MetricsWindow(60 * S, 12, start=T0)  # 5 s buckets
    w.current(T0).dispatched += 1
    w.current(T0 + 4 * S).dispatched += 1  # same bucket
    w.current(T0 + 5 * S).dispatched += 10  # next bucket
    assert w.totals(T0 + 6 * S).dispatched == 12
    # At 60 s the first bucket (0-5 s) has left the ring; the second (5-10 s) is still in.
    assert w.totals(T0 + 60 * S).dispatched == 10
    assert w.totals(T0 + 65 * S).dispatched == 0


def test_time_going_backwards_uses_current_bucket() -> None:
    w = MetricsWindow(60 * S, 12, start=T0)
    head = w.current(T0 + 20 * S)
    assert w.current(T0 + 3 * S) is head
    assert w.current(T0 - 10 * S) is head


def test_long_gap_clears_everything() -> None:
    w = MetricsWindow(60 * S, 12, start=T0)
    for i in range(12):
        w.current(T0 + i * 5 * S).succeeded += 1
    assert w.totals(T0 + 59 * S).succeeded == 12
    later = T0 + 10 * 3600 * S
    w.current(later).succeeded += 1
    assert w.totals(later).succeeded == 1
    assert w.span(later) == 55 * S  # the head slice starts exactly at `later`


def test_integrate_single_bucket() -> None:
    w = MetricsWindow(60 * S, 12, start=T0)
    w.integrate(T0 + 2 * S, busy=3, capacity=4)
    t = w.totals(T0 + 2 * S)
    assert t.busy_ns == 6 * S
    assert t.capacity_ns == 8 * S
    assert t.utilization == 0.75


def test_integrate_splits_across_bucket_boundaries() -> None:
    w = MetricsWindow(60 * S, 12, start=T0)
    w.integrate(T0 + 3 * S, busy=1, capacity=2)  # [0, 3): bucket 0
    w.integrate(T0 + 12 * S, busy=2, capacity=2)  # [3, 12): buckets 0, 1, 2
    ring = w._ring
    assert ring[0].busy_ns == 3 * S + 2 * 2 * S
    assert ring[1].busy_ns == 2 * 5 * S
    assert ring[2].busy_ns == 2 * 2 * S
    assert [b.capacity_ns for b in ring[:3]] == [10 * S, 10 * S, 4 * S]
    t = w.totals(T0 + 12 * S)
    assert t.busy_ns == 3 * S + 18 * S
    assert t.capacity_ns == 24 * S


def test_utilization_is_exact_over_the_window() -> None:
    # capacity 4 throughout; busy alternates between 1 and 3 every 7 s (not aligned to buckets).
    w = MetricsWindow(60 * S, 12, start=T0)
    t = T0
    busy = 1
    for _ in range(20):
        t += 7 * S
        w.integrate(t, busy, 4)
        busy = 4 - busy
    now = t  # 140 s; the ring covers [85 s, 140 s)
    total = w.totals(now, busy, 4)
    assert w.span(now) == 55 * S
    assert total.capacity_ns == 4 * 55 * S

    def busy_at(x: int) -> int:  # level during second x (0-based)
        return 1 if (x // 7) % 2 == 0 else 3

    assert total.busy_ns == sum(busy_at(x) for x in range(85, 140)) * S


def test_integrate_after_long_gap_counts_only_the_window() -> None:
    w = MetricsWindow(60 * S, 12, start=T0)
    w.integrate(T0 + 10 * S, 0, 2)
    later = T0 + 5 * 3600 * S + 2 * S
    w.integrate(later, 1, 2)  # idle-but-busy-1 for five hours
    total = w.totals(later)
    span = w.span(later)
    assert span == 57 * S
    assert total.busy_ns == span
    assert total.capacity_ns == 2 * span
    assert total.utilization == 0.5


def test_totals_uses_given_or_last_levels() -> None:
    w = MetricsWindow(60 * S, 12, start=T0)
    w.integrate(T0 + S, 2, 2)
    assert w.totals(T0 + 2 * S).busy_ns == 4 * S  # assumes the last levels still hold
    assert w.totals(T0 + 3 * S, busy=0, capacity=2).busy_ns == 4 * S
    assert w.totals(T0 + 3 * S).capacity_ns == 6 * S


def test_integrate_ignores_time_going_backwards() -> None:
    w = MetricsWindow(60 * S, 12, start=T0)
    w.integrate(T0 + 10 * S, 1, 1)
    w.integrate(T0 + 5 * S, 1, 1)
    w.integrate(T0 + 11 * S, 1, 1)
    assert w.totals(T0 + 11 * S).busy_ns == 11 * S


def test_integrate_on_exact_boundary() -> None:
    w = MetricsWindow(60 * S, 12, start=T0)
    w.integrate(T0 + 5 * S, 1, 1)  # ends exactly where bucket 1 starts
    assert w._ring[0].busy_ns == 5 * S
    assert w._ring[1].busy_ns == 0
    w.integrate(T0 + 65 * S, 1, 1)  # [5 s, 65 s) still fits the ring ending with slice 12
    assert w.totals(T0 + 65 * S - 1).busy_ns == 60 * S
    # At 65 s slice 13 opens and slice 1 ([5 s, 10 s)) leaves.
    total = w.totals(T0 + 65 * S)
    assert total.busy_ns == 55 * S
    assert w.span(T0 + 65 * S) == 55 * S


def test_span() -> None:
    w = MetricsWindow(60 * S, 12, start=T0)
    assert w.span(T0) == 0
    assert w.span(T0 + 30 * S) == 30 * S
    assert w.span(T0 + 59 * S) == 59 * S
    assert w.span(T0 + 60 * S) == 55 * S  # ring is slices 1..12 = [5 s, 65 s)
    assert w.span(T0 + 62 * S) == 57 * S
    assert w.span(T0 + 64 * S + 999) == 59 * S + 999


def test_window_not_divisible_by_buckets() -> None:
    w = MetricsWindow(10, 3, start=0)  # 3 ns buckets, ring covers 9 ns
    assert w.width == 3
    w.integrate(10, 1, 1)
    assert w.totals(10).busy_ns == 7  # slices 1..3 = [3, 12)
    assert w.span(10) == 7


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-2 * S, 20 * S), st.integers(0, 8), st.integers(0, 8)), max_size=30))
def test_integrate_current_is_integrate_then_current(steps: list[tuple[int, int, int]]) -> None:
    one = MetricsWindow(60 * S, 12, start=T0)
    two = MetricsWindow(60 * S, 12, start=T0)
    now = T0
    for delta, busy, capacity in steps:
        now = max(T0, now + delta)
        combined = one.integrate_current(now, busy, capacity)
        two.integrate(now, busy, capacity)
        separate = two.current(now)
        combined.dispatched += 1  # the bucket handed back is the live one
        separate.dispatched += 1
    a, b = one.totals(now), two.totals(now)
    assert (a.busy_ns, a.capacity_ns, a.dispatched) == (b.busy_ns, b.capacity_ns, b.dispatched)
