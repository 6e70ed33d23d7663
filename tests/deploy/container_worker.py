"""The worker the image test runs in its own container: ``python3 worker.py TARGET POOL``.

Its token comes from ``CRONOQ_WORKER_TOKEN``. Each task's output tells where and as whom it ran:
the payload back, the process's uid and the container's host name.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys

from cronoq.client import Lease, Worker


async def main(target: str, pool: str) -> None:
    async def handler(lease: Lease) -> dict[str, object]:
        return {"echo": lease.json(), "uid": os.getuid(), "host": socket.gethostname()}

    worker = Worker(target, pool, handler, token=os.environ["CRONOQ_WORKER_TOKEN"], slots=2, name="container")
    run = asyncio.ensure_future(worker.run())
    await worker.wait_registered(60)
    print("registered", flush=True)
    await run


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
