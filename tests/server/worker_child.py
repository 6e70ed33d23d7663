"""A worker process whose handler never returns: ``worker_child.py TARGET POOL TOKEN``.

Prints ``registered`` once the server accepted it and ``leased <task id> <attempt>`` for each
lease, so a test can kill (SIGKILL) or freeze (SIGSTOP) it while it holds a lease.
"""

from __future__ import annotations

import asyncio
import sys

from cronoq.client import Lease, Worker


async def main(target: str, pool: str, token: str) -> None:
    async def handler(lease: Lease) -> bytes:
        print(f"leased {lease.task_id} {lease.attempt}", flush=True)
        await asyncio.sleep(3600)
        return b""

    worker = Worker(target, pool, handler, token=token, slots=1, name="child", reconnect=False)
    run = asyncio.ensure_future(worker.run())
    await worker.wait_registered(20)
    print("registered", flush=True)
    await run


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
