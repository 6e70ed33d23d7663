"""The one exception of ``cronoq.config``."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["ConfigError"]


class ConfigError(Exception):
    """A configuration that cannot be used, with every problem found (not just the first).

    Each entry of ``errors`` starts with the key path it concerns, e.g.
    ``"pools[1].lease_ttl_s: must be greater than 0"``, so ``cronoq-server --check`` can print
    them one per line. Messages never contain a token or a database URL.
    """

    def __init__(self, errors: Iterable[str]) -> None:
        self.errors: list[str] = list(errors)
        super().__init__(self._text())

    def _text(self) -> str:
        if len(self.errors) == 1:
            return f"invalid configuration: {self.errors[0]}"
        lines = "\n".join(f"  - {error}" for error in self.errors)
        return f"invalid configuration ({len(self.errors)} problems):\n{lines}"
