"""Steps a store encoded ahead of their commit (the optional ``Store.prepare`` hook)."""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from cronoq.engine.actions import Mutation

Encoded = TypeVar("Encoded")


class PreparedSteps(Generic[Encoded]):
    """A few recently encoded steps, each found again by the very list object it came from (the
    driver commits the same list it prepared). Encoding errors are left for the commit to raise."""

    def __init__(self, encode: Callable[[Sequence[Mutation]], Encoded], keep: int = 4) -> None:
        self._encode = encode
        self._steps: collections.deque[tuple[Sequence[Mutation], Encoded]] = collections.deque(maxlen=keep)

    def add(self, mutations: Sequence[Mutation]) -> None:
        try:
            self._steps.append((mutations, self._encode(mutations)))
        except (ValueError, TypeError):
            return

    def take(self, mutations: Sequence[Mutation]) -> Encoded | None:
        """The encoding of ``mutations`` if it was prepared (and forget it), else None."""
        steps = self._steps
        for entry in steps:
            if entry[0] is mutations:
                steps.remove(entry)
                return entry[1]
        return None

    def clear(self) -> None:
        self._steps.clear()

    def __len__(self) -> int:
        return len(self._steps)
