"""A worker process for the fuzz tests: ``echo_worker.py TARGET POOL TOKEN``. Each task's output
is its payload; prints ``registered`` once the server accepted it, and runs until killed."""

from __future__ import annotations

import asyncio
import sys

from cronoq.client import Lease, Worker


async def main(target: str, pool: str, token: str) -> None:
    async def echo(lease: Lease) -> bytes:
        return lease.payload

    worker = Worker(target, pool, echo, token=token, slots=8, name="fuzz-echo", backoff=(0.05, 0.5))
    run = asyncio.ensure_future(worker.run())
    await worker.wait_registered(30)
    print("registered", flush=True)
    await run


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
