"""How hard the fuzz tests try: a short run in ``make test``, a long one in ``make fuzz``.

``CRONOQ_FUZZ=long`` multiplies every fuzz test's example count by ``CRONOQ_FUZZ_SCALE`` (default
40). Property tests elsewhere may use the same switch: ``examples(25)`` is 25 in ``make test`` and
1000 in ``make fuzz``.
"""

from __future__ import annotations

import os

__all__ = ["LONG", "SCALE", "examples"]

LONG = os.environ.get("CRONOQ_FUZZ", "").strip().lower() == "long"
"""``make fuzz`` is running (``CRONOQ_FUZZ=long``)."""

SCALE = max(1, int(os.environ.get("CRONOQ_FUZZ_SCALE", "40"))) if LONG else 1


def examples(short: int) -> int:
    """The example count for a test that tries ``short`` examples in the short run."""
    return short * SCALE
