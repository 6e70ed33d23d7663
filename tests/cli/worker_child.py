"""The test worker in its own process: ``worker_child.py TARGET POOL TOKEN NAME``.

It serves the pool with four slots and decides what to do from the payload:

* ``{"fail": "why"}`` fails the task for good with that message;
* ``{"hold": "name"}`` runs until the line ``release name`` arrives on standard input;
* ``{"sleep": seconds}`` runs that long, then echoes the payload;
* anything else is echoed back byte for byte as the output.

It prints ``registered`` once the server has accepted it. (A process of its own, because a test
process with gRPC threads cannot safely fork the pseudo-terminals of the ``cronoq top`` tests.)
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading

from cronoq.client import Lease, Worker
from cronoq.errors import Permanent


async def main(target: str, pool: str, token: str, name: str) -> None:
    loop = asyncio.get_running_loop()
    holds: dict[str, asyncio.Event] = {}

    def hold(key: str) -> asyncio.Event:
        return holds.setdefault(key, asyncio.Event())

    async def handle(lease: Lease) -> bytes:
        try:
            request = json.loads(lease.payload)
        except ValueError:
            request = None
        if isinstance(request, dict) and "fail" in request:
            raise Permanent(str(request["fail"]))
        if isinstance(request, dict) and "hold" in request:
            key = str(request["hold"])
            await hold(key).wait()
            return f"released {key}".encode()
        if isinstance(request, dict) and "sleep" in request:
            await asyncio.sleep(float(request["sleep"]))
        return lease.payload

    def read_commands() -> None:
        for line in sys.stdin:
            command, _, key = line.strip().partition(" ")
            if command == "release":
                loop.call_soon_threadsafe(lambda k=key: hold(k).set())
        loop.call_soon_threadsafe(stop.set)

    stop = asyncio.Event()
    worker = Worker(target, pool, handle, token=token, slots=4, name=name, backoff=(0.05, 0.5), labels={"zone": "test"})
    serving = asyncio.ensure_future(worker.run())
    await worker.wait_registered(30)
    print("registered", flush=True)
    threading.Thread(target=read_commands, daemon=True).start()
    await stop.wait()  # standard input closed: the test is done with us
    await worker.stop(0.5)
    await serving


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
