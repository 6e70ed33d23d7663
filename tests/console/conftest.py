"""Lists the screenshots the console's browser tests wrote, at the end of the run."""

from __future__ import annotations

from typing import Any

from tests.console.browser import WRITTEN


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if WRITTEN:
        terminalreporter.section("console screenshots")
        for path in WRITTEN:
            terminalreporter.write_line(str(path))
