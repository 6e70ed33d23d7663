"""The check of ``tests/pending_tasks.py`` sees a task its owner dropped while it was pending."""

from __future__ import annotations

import asyncio
import gc

from tests.pending_tasks import REPORTS


def test_a_dropped_pending_task_is_reported() -> None:
    loop = asyncio.new_event_loop()

    async def wait_forever() -> None:
        await loop.create_future()

    try:
        task = loop.create_task(wait_forever())
        loop.run_until_complete(asyncio.sleep(0))
        assert not task.done()
        del task  # nothing else holds it: the future it awaits and the task only hold each other
        gc.collect()
        reports = REPORTS.unclaimed()  # claimed here, so this test does not fail for it
    finally:
        loop.close()
    assert len(reports) == 1, reports
    assert "wait_forever" in reports[0]
