"""Fail the tests when an asyncio task is destroyed while still pending.

asyncio reports such a task ("Task was destroyed but it is pending!") through the loop's exception
handler, which only logs it: the task's owner dropped it without cancelling and awaiting it, so
whatever it still had to do (a commit, a reply, a close) silently never happens. ``tests/conftest.py``
puts ``REPORTS`` on the ``asyncio`` logger for the whole session:

- a report logged while a test runs fails that test (at its teardown, after its event loop closed);
  the garbage collector may destroy a task some time after its owner dropped it, so the culprit
  can be an earlier test: the report names the task's coroutine;
- a report logged after the last test's check, or found by a last collection at the end of the
  session, fails the session.

With ``CRONOQ_TASK_CHECK=each`` every test ends with a full garbage collection (slower), so the
report fails the very test that dropped the task.
"""

from __future__ import annotations

import gc
import logging
import os

import pytest

MESSAGE = "Task was destroyed but it is pending!"


def failure_text(reports: list[str]) -> str:
    tasks = "\n".join(reports)
    return (
        f"{len(reports)} asyncio task(s) destroyed while pending, owned by nobody (cancel and await "
        f"them on close; the task may come from an earlier test):\n{tasks}"
    )


class PendingTaskReports(logging.Handler):
    """Collects asyncio's reports of destroyed pending tasks; each is failed for once."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.reports: list[str] = []
        self.claimed = 0

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if text.startswith(MESSAGE):
            self.reports.append(text)

    def unclaimed(self) -> list[str]:
        new = self.reports[self.claimed :]
        self.claimed = len(self.reports)
        return new

    def check_test(self) -> None:
        """Fail the test that just ran when reports came in since the previous check."""
        if os.environ.get("CRONOQ_TASK_CHECK") == "each":
            gc.collect()
        new = self.unclaimed()
        if new:
            pytest.fail(failure_text(new), pytrace=False)

    def check_session(self, session: pytest.Session) -> None:
        """Collect what is left and fail the session on reports no test has failed for."""
        gc.collect()
        new = self.unclaimed()
        if new:
            session.config.get_terminal_writer().line(failure_text(new), red=True)
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


REPORTS = PendingTaskReports()
logging.getLogger("asyncio").addHandler(REPORTS)
