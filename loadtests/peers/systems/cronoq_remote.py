"""cronoq through a real ``cronoq-server`` on Postgres, served by ``cronoq.client.Worker`` processes.

Driver side: a ``cronoq-server`` (one shard, the Postgres store in a database of the case's own)
started as ``loadtests/server_bench.py`` does, and tasks sent with ``Client.submit_batch``.
Worker side (``python -m peers.systems.cronoq_remote TARGET HANDLER SLOTS NAME``): one
``cronoq.client.Worker`` with ``SLOTS`` slots and the client's default transport.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from typing import Any

from peers.probe import PROBE, TASK_SECONDS
from peers.systems.base import Case, Database, System, python_command

POOL = "default"  # server_bench's pool
NOOP_SLOTS = 256
"""Slots of each worker when tasks do nothing (the largest a server grants by default,
``max_slots_per_worker``): as pgqueuer's no-op jobs run uncapped, 500 fetched at a time, ours are
capped only by the server's pool (``max`` 512 in server_bench's configuration). The more leases
in flight, the more of them each message and each commit carries; 64, 128 and 256 were measured
(loadtests/peers/README.md). Tasks that take time keep ``--concurrency`` like every system's."""


class CronoqRemote(System):
    name = "cronoq"
    backend = "postgres"
    libraries = ("grpc", "asyncpg")

    def __init__(self, case: Case) -> None:
        super().__init__(case)
        self.database: Database = Database.for_case(case, "cronoq")
        self.server: Any = None
        self.client: Any = None

    async def open(self) -> None:
        from server_bench import Server

        from cronoq.client import Client

        await self.database.create()
        self.durability = f"Postgres commit per batch, {await self.database.durability()}"
        store = f'[store]\nkind = "postgres"\nurl = {json.dumps(self.database.dsn)}\nschema = "cronoq_bench"'
        self.server = Server(self.case.workdir, store, pending=max(2 * self.case.tasks, 100_000)).start()
        self.parts.server = self.server.proc.pid
        self.parts.postmaster, self.parts.database = self.database.postmaster, self.database.name
        self.client = Client(self.server.grpc_target)
        self.settings = {
            "server": "cronoq-server, one shard, Postgres store, max_tasks_per_batch 1000",
            "worker": f"cronoq.client.Worker, slots={self.slots}, default transport",
            "submit": "Client.submit_batch, chunks of 1000, 4 concurrent submitters",
        }

    @property
    def slots(self) -> int:
        return NOOP_SLOTS if self.case.handler == "noop" else self.case.concurrency

    def worker_commands(self) -> list[list[str]]:
        return [python_command("cronoq_remote", self.server.grpc_target, self.case.handler,
                               str(self.slots), f"peer-{n}")
                for n in range(self.case.workers)]  # fmt: skip

    async def submit(self, stamps: list[float]) -> None:
        from cronoq.client import task

        specs = [task(repr(stamp) if stamp else None, pool=POOL) for stamp in stamps]
        answer = await self.client.submit_batch(specs)
        if len(answer) != len(specs):
            raise RuntimeError(f"a batch of {len(specs)} was answered with {len(answer)} ids")

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()
        if self.server is not None:
            self.server.stop()
        await self.database.drop()


# ---------------------------------------------------------------------------------------------
# Worker process


async def serve(target: str, handler: str, slots: int, name: str) -> None:
    from cronoq.client import Lease, Worker

    seconds = TASK_SECONDS[handler]

    async def bench(lease: Lease) -> None:
        await PROBE.run(float(lease.payload) if lease.payload else 0.0, seconds)

    worker = Worker(target, POOL, bench, slots=slots, name=name, reconnect=False, grace=0.0)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: loop.create_task(worker.stop(grace=0.0)))
    await worker.run()


def main() -> None:
    import cronoq.client

    target, handler, slots, name = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    # What server_bench's workers do too: gRPC's poller-thread endpoints, where the client has them.
    prefer = getattr(cronoq.client, "prefer_poller_endpoints", None)
    if prefer is not None:
        prefer()
    import uvloop

    uvloop.run(serve(target, handler, slots, name))


if __name__ == "__main__":
    main()
