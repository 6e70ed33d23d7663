"""Keys of recurring runs: ``<template key>@<start in UTC, RFC 3339>``, a form the server keeps for
schedules alone (a client that took a run's key first would silence that run)."""

from __future__ import annotations

from cronoq.engine.recurring import RUN_KEY_SUFFIX_LEN, is_run_key, run_key
from cronoq.engine.types import NS_PER_S
from hypothesis import given
from hypothesis import strategies as st

FIRST_SECOND = -62_135_596_800  # 0001-01-01T00:00:00Z
LAST_SECOND = 253_402_300_799  # 9999-12-31T23:59:59Z


@given(prefix=st.text(min_size=1, max_size=40), second=st.integers(FIRST_SECOND, LAST_SECOND),
       fraction=st.integers(0, NS_PER_S - 1))  # fmt: skip
def test_every_run_key_has_the_reserved_form_and_a_fixed_suffix(prefix: str, second: int, fraction: int) -> None:
    key = run_key(prefix, second * NS_PER_S + fraction)
    assert is_run_key(key)
    assert len(key) == len(prefix) + RUN_KEY_SUFFIX_LEN


def test_only_that_exact_form_is_reserved() -> None:
    assert is_run_key("nightly@2026-03-08T07:30:00Z") and is_run_key("@0001-01-01T00:00:00Z")
    for free in ("nightly", "nightly@2026-03-08", "nightly@2026-03-08T07:30:00+00:00", "nightly@2026-03-08T07:30:00Z-2",
                 "nightly@2026-03-08T07:30:00.5Z", "nightly@2026-03-08t07:30:00z", "nightly@٢٠٢٦-03-08T07:30:00Z",
                 "nightly@2026-03-08T07:30:00Z\n"):  # fmt: skip
        assert not is_run_key(free), free
