"""procrastinate on Postgres: ``App.run_worker_async`` worker processes, ``batch_defer_async`` batches.

Configuration (see loadtests/peers/README.md): a ``PsycopgConnector`` (psycopg 3 async pool of
``POOL_SIZE`` connections per process), one queue, an async task; each worker runs
``concurrency`` jobs at once (64, the slots of a cronoq worker) with LISTEN/NOTIFY on. The
producer sends each chunk with one ``batch_defer_async`` call.
"""

from __future__ import annotations

import os
from typing import Any

from peers.probe import PROBE, TASK_SECONDS
from peers.systems.base import Case, Database, System, python_command

QUEUE = "bench"
TASK = "bench"
POOL_SIZE = 8  # connections per worker process: its fetch loop, finishing jobs and LISTEN


def make_app(dsn: str, pool_size: int, handler: str) -> Any:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn, min_size=1, max_size=pool_size))

    seconds = TASK_SECONDS[handler]

    @app.task(name=TASK, queue=QUEUE)
    async def bench(stamp: float) -> None:
        await PROBE.run(stamp, seconds)

    return app


class Procrastinate(System):
    name = "procrastinate"
    backend = "postgres"
    libraries = ("procrastinate", "psycopg", "psycopg_pool")

    def __init__(self, case: Case) -> None:
        super().__init__(case)
        self.database: Database = Database.for_case(case, "procrastinate")
        self.app: Any = None

    async def open(self) -> None:
        await self.database.create()
        self.durability = f"Postgres, {await self.database.durability()}"
        self.parts.postmaster, self.parts.database = self.database.postmaster, self.database.name
        self.app = make_app(self.database.dsn, 4, "noop")
        await self.app.open_async()
        await self.app.schema_manager.apply_schema_async()
        self.settings = {
            "worker": f"App.run_worker_async(concurrency={self.case.concurrency}, listen_notify=True), "
                      f"PsycopgConnector pool of {POOL_SIZE}",
            "submit": "Task.batch_defer_async, chunks of 1000, 4 concurrent submitters",
        }  # fmt: skip

    def worker_commands(self) -> list[list[str]]:
        return [python_command("procrastinate_peer") for _ in range(self.case.workers)]

    def worker_env(self) -> dict[str, str]:
        return {"PEERS_DSN": self.database.dsn, "PEERS_HANDLER": self.case.handler,
                "PEERS_CONCURRENCY": str(self.case.concurrency)}  # fmt: skip

    async def submit(self, stamps: list[float]) -> None:
        await self.app.tasks[TASK].batch_defer_async(*({"stamp": stamp} for stamp in stamps))

    async def close(self) -> None:
        if self.app is not None:
            await self.app.close_async()
        await self.database.drop()


# ---------------------------------------------------------------------------------------------
# Worker process


async def serve() -> None:
    app = make_app(os.environ["PEERS_DSN"], POOL_SIZE, os.environ["PEERS_HANDLER"])
    async with app.open_async():
        await app.run_worker_async(queues=[QUEUE], concurrency=int(os.environ["PEERS_CONCURRENCY"]),
                                   wait=True, listen_notify=True)  # fmt: skip


def main() -> None:
    import logging

    import uvloop

    logging.basicConfig(level=logging.WARNING)
    uvloop.run(serve())


if __name__ == "__main__":
    main()
