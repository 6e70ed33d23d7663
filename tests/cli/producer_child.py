"""A steady stream of submissions in its own process: ``producer_child.py TARGET TOKEN PREFIX SECONDS POOL...``.

It submits one task to each POOL in turn, about every 0.1 s, with the key ``PREFIX-<n>`` and a
payload that keeps the test worker busy for SECONDS, until its standard input closes. Pools of
other shards are forwarded by the server it talks to. It prints ``submitted POOL`` the first
time a submission to each pool is accepted; failed submissions (a server restarting) are
reported on standard error and the stream goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sys
import threading

from cronoq.client import Client


async def main(target: str, token: str, prefix: str, seconds: str, pools: list[str]) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def watch_stdin() -> None:
        sys.stdin.read()  # returns when the test closes our standard input
        loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=watch_stdin, daemon=True).start()
    announced: set[str] = set()
    async with Client(target, token=token) as client:
        for number, pool in zip(itertools.count(), itertools.cycle(pools)):
            if stop.is_set():
                break
            try:
                await client.submit({"sleep": float(seconds)}, pool=pool, key=f"{prefix}-{number}", call_timeout=10.0)
            except Exception as exc:  # keep the stream going; the test judges by what it sees
                print(f"submit to {pool} failed: {exc}", file=sys.stderr, flush=True)
            else:
                if pool not in announced:
                    announced.add(pool)
                    print(f"submitted {pool}", flush=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.1)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]))
