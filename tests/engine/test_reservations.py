from __future__ import annotations

import random

import pytest
from cronoq.engine.config import PoolConfig
from cronoq.engine.reservations import ReservationBook
from cronoq.engine.types import NS_PER_S
from hypothesis import given, settings
from hypothesis import strategies as st

S = NS_PER_S
T0 = 1_700_000_000 * S


def brute_peak(intervals: list[tuple[int, int]], start: int, end: int) -> int:
    end = max(end, start + 1)
    points = {start} | {s for s, _ in intervals if start <= s < end}
    best = 0
    for t in points:
        best = max(best, sum(1 for s, e in intervals if s <= t < max(e, s + 1)))
    return best


def test_limit_from_pool_config() -> None:
    assert PoolConfig("p", max_workers=10).reservation_limit == 5
    assert PoolConfig("p", max_workers=5).reservation_limit == 2
    assert PoolConfig("p", max_workers=1).reservation_limit == 1
    assert PoolConfig("p", max_workers=3, reservable_fraction=0.0).reservation_limit == 1


def test_fits_up_to_limit() -> None:
    book = ReservationBook(PoolConfig("p", max_workers=5).reservation_limit)  # limit 2
    assert book.limit == 2
    assert book.fits(T0, T0 + 10 * S)
    book.add(1, T0, T0 + 10 * S)
    assert book.fits(T0 + 5 * S, T0 + 15 * S)
    book.add(2, T0 + 5 * S, T0 + 15 * S)
    # [5 s, 10 s) already has two; a third overlapping it does not fit.
    assert not book.fits(T0 + 9 * S, T0 + 11 * S)
    assert not book.fits(T0, T0 + 20 * S)
    # Outside the doubly-booked stretch there is room.
    assert book.fits(T0 + 10 * S, T0 + 20 * S)
    assert book.fits(T0 - 5 * S, T0 + 5 * S)
    assert len(book) == 2
    assert 1 in book and 3 not in book


def test_half_open_intervals_touch_without_overlapping() -> None:
    book = ReservationBook(1)
    book.add(1, T0, T0 + S)
    assert book.fits(T0 + S, T0 + 2 * S)
    assert book.fits(T0 - S, T0)
    assert not book.fits(T0 + S - 1, T0 + 2 * S)
    assert book.peak(T0 + S, T0 + 2 * S) == 0


def test_zero_length_reservation_occupies_its_instant() -> None:
    book = ReservationBook(1)
    book.add(1, T0, T0)
    assert book.get(1) == (T0, T0 + 1)
    assert not book.fits(T0, T0)
    assert book.fits(T0 + 1, T0 + 1)
    assert book.peak(T0 - S, T0 + S) == 1


def test_peak() -> None:
    book = ReservationBook(10)
    book.add(1, 0, 10)
    book.add(2, 2, 6)
    book.add(3, 4, 8)
    book.add(4, 12, 20)
    assert book.peak(0, 20) == 3  # [4, 6)
    assert book.peak(0, 4) == 2
    assert book.peak(6, 12) == 2  # [6, 8): 1 and 3
    assert book.peak(8, 12) == 1
    assert book.peak(10, 12) == 0
    assert book.peak(15, 16) == 1
    assert book.peak(20, 30) == 0


def test_remove() -> None:
    book = ReservationBook(1)
    book.add(7, T0, T0 + 60 * S)
    assert not book.fits(T0 + S, T0 + 2 * S)
    assert book.remove(7)
    assert not book.remove(7)
    assert len(book) == 0
    assert 7 not in book
    assert book.fits(T0 + S, T0 + 2 * S)
    book.add(7, T0, T0 + S)  # the owner can book again


def test_duplicate_owner_is_rejected() -> None:
    book = ReservationBook(3)
    book.add(1, 0, 10)
    with pytest.raises(ValueError):
        book.add(1, 20, 30)


def test_removing_the_longest_keeps_lookups_correct() -> None:
    book = ReservationBook(5)
    book.add(1, 0, 1000)
    book.add(2, 900, 950)
    book.add(3, 960, 970)
    book.remove(1)
    assert book.peak(940, 965) == 1
    assert book.peak(0, 900) == 0
    book.add(4, 0, 2000)
    assert book.peak(940, 965) == 2
    assert book.owners() == [4, 2, 3]


def test_identical_intervals_with_different_owners() -> None:
    book = ReservationBook(2)
    book.add(1, 0, 10)
    book.add(2, 0, 10)
    assert not book.fits(5, 6)
    assert book.remove(2)
    assert book.fits(5, 6)
    assert book.get(1) == (0, 10)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 100), st.integers(0, 40)),
        max_size=25,
    ),
    st.integers(0, 120),
    st.integers(0, 30),
    st.integers(0, 2**32),
)
def test_peak_matches_brute_force(spans: list[tuple[int, int]], q_start: int, q_len: int, seed: int) -> None:
    book = ReservationBook(100)
    live: dict[int, tuple[int, int]] = {}
    rng = random.Random(seed)
    for owner, (start, length) in enumerate(spans):
        book.add(owner, start, start + length)
        live[owner] = (start, start + length)
        if live and rng.random() < 0.3:
            victim = rng.choice(sorted(live))
            assert book.remove(victim)
            del live[victim]
    assert len(book) == len(live)
    expected = brute_peak(list(live.values()), q_start, q_start + q_len)
    assert book.peak(q_start, q_start + q_len) == expected
