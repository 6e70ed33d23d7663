"""Numbers at and beyond every edge the engine documents, for property tests: extreme values of
deadlines, fixed starts, tolerances, timeouts, duration hints and retry policies, and an
independent statement of which of them must be refused at admission.

The ranges: instants in [0, 2**63) ns (int64, what the stores' columns hold); durations in
[0, 100 years]; a timeout is positive; 1 <= max_attempts < 2**32; a retry multiplier is a finite
number of at least 1.

``examples`` is the shared fuzz budget: ``make fuzz`` (CRONOQ_FUZZ=long) multiplies the counts.
"""

from __future__ import annotations

import math

from cronoq.engine import FixedStart, MissPolicy, RetryPolicy, TaskSpec
from cronoq.engine.limits import MAX_COUNT, MAX_DURATION, MAX_INSTANT
from hypothesis import strategies as st

from tests.fuzz.budget import examples as examples  # re-exported for the property tests

from .sim import START, ns

# Numbers at and beyond every edge, for the "extreme" submissions.
BAD_INTS = [-1, -(2**63), 2**63, 2**64, 10**30]
EXTREME_INSTANTS = [0, 1, START, MAX_INSTANT - 1, MAX_INSTANT, *BAD_INTS]
EXTREME_DURATIONS = [0, 1, ns(0.5), MAX_DURATION, MAX_DURATION + 1, *BAD_INTS]
# Weighted towards what used to overflow (a power of a huge multiplier from the fourth attempt on).
EXTREME_MULTIPLIERS = [1.0, 2.0, 10.0, 1e160, 1e200, 1e300, 1e308, 1e308, 1e308, math.inf, math.nan, 0.5, -2.0]
EXTREME_ATTEMPTS = [1, 4, 6, 6, 8, MAX_COUNT, MAX_COUNT + 1, 0, 2**64]

extreme_params = st.fixed_dictionaries({
    "deadline": st.one_of(st.none(), st.sampled_from(EXTREME_INSTANTS)),
    "start": st.one_of(st.none(), st.sampled_from(EXTREME_INSTANTS)),
    "tolerance": st.sampled_from(EXTREME_DURATIONS),
    # No 1 ns timeout: an attempt timing out every nanosecond would retry billions of times
    # within one simulated minute (legal, but endless for a test that stops at every timer).
    "timeout": st.one_of(st.none(), st.sampled_from([d for d in EXTREME_DURATIONS if d != 1])),
    "hint": st.one_of(st.none(), st.sampled_from(EXTREME_DURATIONS)),
    "retry": st.one_of(st.none(), st.tuples(st.sampled_from(EXTREME_ATTEMPTS),
                                            st.sampled_from([0, 1, 1, ns(1), MAX_DURATION, -1, 2**64]),
                                            st.sampled_from(EXTREME_MULTIPLIERS),
                                            st.sampled_from([0, 1, ns(1), ns(1), MAX_DURATION, MAX_DURATION + 1, -5]),
                                            st.booleans())),
})  # fmt: skip


def out_of_range(params: dict[str, object]) -> bool:
    """Whether an extreme submission must be refused as invalid (an independent statement of the
    documented ranges: instants in [0, 2**63), durations in [0, 100 years], timeouts positive,
    1 <= max_attempts < 2**32, a finite multiplier of at least 1)."""

    def instant(v: object) -> bool:
        return not 0 <= v < 2**63  # type: ignore[operator]

    def duration(v: object) -> bool:
        return not 0 <= v <= MAX_DURATION  # type: ignore[operator]

    if params["deadline"] is not None and instant(params["deadline"]):
        return True
    if params["start"] is not None and (instant(params["start"]) or duration(params["tolerance"])):
        return True
    timeout = params["timeout"]
    if timeout is not None and (duration(timeout) or timeout == 0):
        return True
    if params["hint"] is not None and duration(params["hint"]):
        return True
    if params["retry"] is not None:
        attempts, initial, multiplier, ceiling, _ = params["retry"]  # type: ignore[misc]
        if not 1 <= attempts < 2**32 or duration(initial) or duration(ceiling):
            return True
        if not (math.isfinite(multiplier) and multiplier >= 1.0):
            return True
    return False


def apply_extremes(spec: TaskSpec, params: dict[str, object]) -> TaskSpec:
    """``spec`` with the drawn extreme fields set (in place)."""
    spec.deadline = params["deadline"]  # type: ignore[assignment]
    if params["start"] is not None:
        spec.fixed_start = FixedStart(params["start"], params["tolerance"], MissPolicy.RUN_LATE)  # type: ignore[arg-type]
    spec.timeout = params["timeout"]  # type: ignore[assignment]
    spec.duration_hint = params["hint"]  # type: ignore[assignment]
    if params["retry"] is not None:
        attempts, initial, multiplier, ceiling, jitter = params["retry"]  # type: ignore[misc]
        spec.retry = RetryPolicy(attempts, initial, multiplier, ceiling, jitter)
    return spec
