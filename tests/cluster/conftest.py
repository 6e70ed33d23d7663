"""Fixtures shared by the local-cluster tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .helpers import UpProcess


@pytest.fixture
def launched() -> Iterator[list[UpProcess]]:
    """Every ``up`` a test starts; all stopped (and their servers killed) afterwards."""
    started: list[UpProcess] = []
    yield started
    for up in started:
        up.cleanup()
