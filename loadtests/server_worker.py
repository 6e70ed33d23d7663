"""One remote worker for ``server_bench.py``: ``server_worker.py TARGET POOL SLOTS [NAME]``.

Runs a ``cronoq.client.Worker`` whose async handler does nothing and returns no output. Prints
``registered`` once the server has accepted it; SIGTERM or SIGINT stops it without waiting for
running leases. It opts in to gRPC's poller-thread endpoints (``cronoq.grpc_transport``), as
a worker tuned for throughput would. Runs on uvloop when it is installed, as the server does (``CRONOQ_NO_UVLOOP=1``
turns that off).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from cronoq.client import Lease, Worker, prefer_poller_endpoints


async def noop(lease: Lease) -> None:
    return None


async def serve(target: str, pool: str, slots: int, name: str) -> None:
    worker = Worker(target, pool, noop, slots=slots, name=name, reconnect=False, grace=0.0)
    loop = asyncio.get_running_loop()
    stopping: list[asyncio.Task[None]] = []

    def on_signal() -> None:
        if not stopping:
            stopping.append(loop.create_task(worker.stop(grace=0.0)))

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    run = asyncio.ensure_future(worker.run())
    registered = asyncio.ensure_future(worker.wait_registered())
    await asyncio.wait({run, registered}, return_when=asyncio.FIRST_COMPLETED)
    if registered.done():
        print("registered", flush=True)
    else:
        registered.cancel()
    try:
        await run
    except Exception as exc:  # a lost stream while the bench tears down is not worth a traceback
        if not stopping:
            print(f"worker {name} ended: {exc}", file=sys.stderr, flush=True)
            raise SystemExit(1) from None


def main() -> None:
    target, pool, slots = sys.argv[1], sys.argv[2], int(sys.argv[3])
    name = sys.argv[4] if len(sys.argv) > 4 else f"bench-{os.getpid()}"
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    prefer_poller_endpoints()  # what a worker fleet tuned for throughput would do (cronoq.grpc_transport)
    coro = serve(target, pool, slots, name)
    if os.environ.get("CRONOQ_NO_UVLOOP") != "1":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            uvloop.run(coro)
            return
    asyncio.run(coro)


if __name__ == "__main__":
    main()
