from __future__ import annotations

import math
from dataclasses import replace

from cronoq.engine.autoscale import Autoscaler, ceil_clean
from cronoq.engine.config import AutoscaleConfig
from cronoq.engine.types import NS_PER_MS, NS_PER_S

S = NS_PER_S
T0 = 1_700_000_000 * S
NONE = (0, 0, 0, 0)
CFG = AutoscaleConfig()


def make(
    config: AutoscaleConfig = CFG,
    *,
    min_workers: int = 0,
    max_workers: int = 100,
    initial: int = 4,
    default_duration: int = S,
) -> Autoscaler:
    return Autoscaler(config, min_workers, max_workers, default_duration, initial, T0)


def test_ceil_clean() -> None:
    noisy = 0.1 * 3 / 0.075
    assert noisy > 4 and math.ceil(noisy) == 5
    assert ceil_clean(noisy) == 4
    assert ceil_clean(4.2) == 5
    assert ceil_clean(0.0) == 0


def test_initial_state() -> None:
    a = make(initial=3)
    assert a.desired == 3
    assert a.arrival_rate == 0.0
    assert a.service_time == 1.0
    assert a.next_evaluation() == T0 + S
    # Initial capacity is kept below the minimum; it is capped at the maximum.
    assert make(min_workers=5, initial=2).desired == 2
    assert make(max_workers=3, initial=8).desired == 3


def test_base_from_rate_and_service_time() -> None:
    # λ = 10/s, S = 0.3 s, target 0.75: ceil(10 * 0.3 / 0.75) = 4.
    a = make(initial=4)
    a.record_arrivals(10)
    a.record_run(300 * NS_PER_MS)
    assert a.evaluate(T0 + S, NONE, busy=0, reserved=0) == 4
    assert a.arrival_rate == 10.0
    assert math.isclose(a.service_time, 0.3)
    assert a.last_raw == 4


def test_rate_is_measured_over_elapsed_time_and_smoothed() -> None:
    a = make()
    a.record_arrivals(20)
    a.evaluate(T0 + 2 * S, NONE, 0, 0)  # 20 tasks in 2 s
    assert a.arrival_rate == 10.0
    a.record_arrivals(20)
    a.evaluate(T0 + 3 * S, NONE, 0, 0)  # 20/s: 10 + 0.3 * (20 - 10)
    assert math.isclose(a.arrival_rate, 13.0)
    a.evaluate(T0 + 4 * S, NONE, 0, 0)  # 0/s: 13 * 0.7
    assert math.isclose(a.arrival_rate, 9.1)


def test_service_time_uses_interval_mean() -> None:
    a = make()
    a.record_run(200 * NS_PER_MS)
    a.record_run(400 * NS_PER_MS)
    a.evaluate(T0 + S, NONE, 0, 0)
    assert math.isclose(a.service_time, 0.3)
    a.evaluate(T0 + 2 * S, NONE, 0, 0)  # no completions: unchanged
    assert math.isclose(a.service_time, 0.3)
    a.record_run(1300 * NS_PER_MS)
    a.evaluate(T0 + 3 * S, NONE, 0, 0)  # 0.3 + 0.3 * (1.3 - 0.3)
    assert math.isclose(a.service_time, 0.6)


def test_float_noise_does_not_add_a_worker() -> None:
    # λ = 3/s, S = 0.1 s, target 0.075: 0.30000000000000004 / 0.075 = 4.000000000000001 -> 4.
    a = make(replace(CFG, target_utilization=0.075), initial=0)
    a.record_arrivals(3)
    a.record_run(100 * NS_PER_MS)
    assert a.evaluate(T0 + S, NONE, 0, 0) == 4


def test_base_is_zero_below_minimum_rate() -> None:
    a = make(initial=0)
    a.record_arrivals(10)
    a.record_run(300 * NS_PER_MS)
    a.evaluate(T0 + S, NONE, 0, 0)
    # No further arrivals: λ = 10 * 0.7**n. After 19 more evaluations λ ≈ 0.0114 (base 1),
    # after 20 λ ≈ 0.0080 < 0.01 (base 0).
    for k in range(2, 21):
        a.evaluate(T0 + k * S, NONE, 0, 0)
    assert 0.01 < a.arrival_rate < 0.012
    assert a.target(NONE, 0, 0) == 1
    a.evaluate(T0 + 21 * S, NONE, 0, 0)
    assert a.arrival_rate < 0.01
    assert a.target(NONE, 0, 0) == 0


def test_drain_term() -> None:
    # λ = 0, S = default 1 s, 45 queued: ceil(45 * 1 / 30) = 2.
    a = make(initial=0)
    assert a.evaluate(T0 + S, (0, 0, 45, 0), 0, 0) == 2


def test_base_plus_drain() -> None:
    # base 4 (as above) + drain ceil(100 * 0.3 / 30) = 1 (30.000000000000004 / 30 rounds to 1).
    a = make(initial=4)
    a.record_arrivals(10)
    a.record_run(300 * NS_PER_MS)
    assert a.evaluate(T0 + S, (10, 20, 30, 40), 0, 0) == 5


def test_slo_term() -> None:
    cfg = replace(CFG, slo=(1 * S, None, 2 * S, 1 * S))
    a = make(cfg, initial=4)
    a.record_run(500 * NS_PER_MS)
    # S = 0.5. critical: ceil(2 * 0.5 / 1) = 1; normal: B<=2 = 32, ceil(32 * 0.5 / 2) = 8;
    # low has an SLO but no backlog, so it does not count (it would give 16).
    # drain = ceil(32 * 0.5 / 30) = 1, base = 0. raw = max(1, 8, 0) = 8; step from 4 is +4.
    assert a.evaluate(T0 + S, (2, 10, 20, 0), 0, 0) == 8
    assert a.last_raw == 8


def test_busy_floor() -> None:
    a = make(initial=7)
    assert a.evaluate(T0 + S, NONE, busy=7, reserved=0) == 7


def test_reserved_is_added() -> None:
    # base 4 + reserved 3.
    a = make(initial=4)
    a.record_arrivals(10)
    a.record_run(300 * NS_PER_MS)
    assert a.evaluate(T0 + S, NONE, 0, reserved=3) == 7
    # Reserved also adds on top of busy.
    b = make(initial=4)
    assert b.evaluate(T0 + S, NONE, busy=5, reserved=2) == 7


def test_clamp_to_bounds() -> None:
    a = make(min_workers=2, max_workers=6, initial=6)
    assert a.target(NONE, busy=9, reserved=1) == 6
    assert a.evaluate(T0 + S, NONE, busy=9, reserved=1) == 6
    b = make(min_workers=2, max_workers=6, initial=0)
    assert b.evaluate(T0 + S, NONE, 0, 0) == 2  # raised to the minimum


def test_step_up_limit() -> None:
    # Defaults: at most max(ceil(current * 1.0), 4) more per evaluation.
    a = make(initial=2)
    seen = [a.evaluate(T0 + k * S, NONE, busy=50, reserved=0) for k in range(1, 7)]
    assert seen == [6, 12, 24, 48, 50, 50]
    b = make(replace(CFG, max_step_up_ratio=0.5, max_step_up_abs=1), initial=10)
    assert b.evaluate(T0 + S, NONE, busy=40, reserved=0) == 15
    c = make(initial=0)
    assert c.evaluate(T0 + S, NONE, busy=40, reserved=0) == 4


def test_scale_down_held_by_stabilization_then_one_step_per_cooldown() -> None:
    a = make(min_workers=1, initial=10)
    assert a.evaluate(T0 + S, NONE, busy=10, reserved=0) == 10
    for k in range(2, 61):  # raw is now 1, but 10 was seen within the last 60 s
        assert a.evaluate(T0 + k * S, NONE, 0, 0) == 10
    assert a.last_raw == 1
    assert a.evaluate(T0 + 61 * S, NONE, 0, 0) == 9  # the sample from T0 + 1 s has expired
    for k in range(62, 91):  # cooldown of 30 s since the last scale-down
        assert a.evaluate(T0 + k * S, NONE, 0, 0) == 9
    assert a.evaluate(T0 + 91 * S, NONE, 0, 0) == 8
    assert a.evaluate(T0 + 121 * S, NONE, 0, 0) == 7


def test_first_scale_down_waits_for_cooldown_since_start() -> None:
    a = make(replace(CFG, stabilization_window=5 * S), min_workers=1, initial=10)
    for k in range(1, 30):
        assert a.evaluate(T0 + k * S, NONE, 0, 0) == 10
    assert a.evaluate(T0 + 30 * S, NONE, 0, 0) == 9


def test_scale_down_stops_at_stabilized_value() -> None:
    cfg = replace(CFG, max_step_down=5, cooldown=S)
    a = make(cfg, initial=10)
    a.evaluate(T0 + S, NONE, busy=10, reserved=0)
    a.evaluate(T0 + 20 * S, NONE, busy=8, reserved=0)
    # At 62 s the raw 10 (from 1 s) has expired but 8 (from 20 s) is still in the window.
    assert a.evaluate(T0 + 62 * S, NONE, 0, 0) == 8
    # At 81 s only raw 0 values remain (the one from 62 s and now): down by at most 5.
    assert a.evaluate(T0 + 81 * S, NONE, 0, 0) == 3


def test_scale_up_is_not_held_by_cooldown() -> None:
    cfg = replace(CFG, stabilization_window=S, cooldown=30 * S)
    a = make(cfg, min_workers=0, initial=10)
    assert a.evaluate(T0 + 31 * S, NONE, 0, 0) == 9
    assert a.evaluate(T0 + 32 * S, NONE, busy=12, reserved=0) == 12


def test_next_evaluation_stays_on_the_grid() -> None:
    a = make()
    a.evaluate(T0 + S, NONE, 0, 0)
    assert a.next_evaluation() == T0 + 2 * S
    a.evaluate(T0 + 3 * S + 500 * NS_PER_MS, NONE, 0, 0)
    assert a.next_evaluation() == T0 + 4 * S
    a.evaluate(T0 + 10 * 3600 * S, NONE, 0, 0)
    assert a.next_evaluation() == T0 + (10 * 3600 + 1) * S


def test_arrivals_wait_for_elapsed_time() -> None:
    # A second evaluation at the same instant does not divide by zero; arrivals carry over.
    a = make()
    a.record_arrivals(5)
    a.evaluate(T0 + S, NONE, 0, 0)
    a.record_arrivals(4)
    a.evaluate(T0 + S, NONE, 0, 0)
    assert a.arrival_rate == 5.0
    a.evaluate(T0 + 2 * S, NONE, 0, 0)
    assert math.isclose(a.arrival_rate, 5.0 + 0.3 * (4.0 - 5.0))
