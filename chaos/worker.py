"""A worker process of a drill: serves one pool with ``cronoq.client.Worker`` and records every
attempt it starts and finishes in the ledger.

The start is recorded before the work begins, under the ledger's unique ``(task id, attempt)``:
an attempt handed out twice is caught the moment the second copy starts. The output names the
attempt that produced it, so the checker can tell whether the store kept the outcome of a stale
attempt. A task's payload says how long to work, and how long its first attempt takes when the
drill wants it to overrun its timeout.

Run as ``python -m cronoq.chaos.worker TARGET POOL NAME LEDGER [SLOTS]``; the bearer token comes
from ``CRONOQ_TOKEN``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from cronoq.client import Lease, Worker

from .ledger import KEEPALIVE, Ledger

__all__ = ["main"]


async def serve(target: str, pool: str, name: str, ledger_path: str, slots: int) -> None:
    ledger = Ledger(ledger_path)

    async def handle(lease: Lease) -> dict[str, int]:
        if not ledger.start_execution(lease.task_id, lease.attempt, name, lease.id, lease.key):
            # A repeat is recorded; running it again would only hide what happened.
            ledger.finish_execution(lease.task_id, lease.attempt, lease.id, "repeat")
            return {"attempt": lease.attempt, "repeat": 1}
        try:
            spec = lease.json() or {}
            work = float(spec.get("work", 0.0))
            slow = float(spec.get("slow", 0.0))
            await asyncio.sleep(slow if slow and lease.attempt == 1 else work)
        except asyncio.CancelledError:
            ledger.finish_execution(lease.task_id, lease.attempt, lease.id, "aborted")
            raise
        ledger.finish_execution(lease.task_id, lease.attempt, lease.id, "succeeded")
        return {"attempt": lease.attempt}

    worker = Worker(target, pool, handle, slots=slots, token=os.environ.get("CRONOQ_TOKEN"), name=name,
                    backoff=(0.05, 1.0), grace=5.0, options=KEEPALIVE)  # fmt: skip
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stopping.set)
    running = asyncio.ensure_future(worker.run())
    waiter = asyncio.ensure_future(stopping.wait())
    await asyncio.wait({running, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if not running.done():
        await worker.stop(1.0)
    waiter.cancel()
    await asyncio.gather(running, waiter, return_exceptions=True)
    ledger.close()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (4, 5):
        print("usage: python -m cronoq.chaos.worker TARGET POOL NAME LEDGER [SLOTS]", file=sys.stderr)
        return 2
    slots = int(args[4]) if len(args) == 5 else 16
    asyncio.run(serve(args[0], args[1], args[2], args[3], slots))
    return 0


if __name__ == "__main__":
    sys.exit(main())
