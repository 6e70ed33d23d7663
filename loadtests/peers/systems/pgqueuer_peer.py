"""pgqueuer on Postgres: ``pgq run`` worker processes, ``Queries.enqueue`` with lists for batches.

Configuration (see loadtests/peers/README.md for why): schema installed with durability
``balanced`` (the job table is logged, only the log and statistics tables are unlogged), each
worker runs ``QueueManager.run(batch_size=BATCH_SIZE)`` as ``pgq run`` would, with an asyncpg
connection, one entrypoint; jobs arrive by LISTEN/NOTIFY. No-op jobs run without a concurrency
limit; 10 ms jobs are capped at ``concurrency`` per worker (``max_concurrent_tasks``, which
pgqueuer requires to be at least twice the batch size, so the batch is half of it), as every
other system's are: otherwise pgqueuer alone would sleep through hundreds of jobs at once.
The producer enqueues each chunk with one ``enqueue`` call of lists (one statement), over an
asyncpg pool of one connection per concurrent submitter.
"""

from __future__ import annotations

import os
from typing import Any

from peers.probe import PROBE, TASK_SECONDS
from peers.systems.base import Case, Database, System, python_command

ENTRYPOINT = "bench"
BATCH_SIZE = 500  # jobs one dequeue takes; 10 (the default), 100 and 500 measured, 500 fastest (README)
DURABILITY = "balanced"


class PgQueuer(System):
    name = "pgqueuer"
    backend = "postgres"
    libraries = ("pgqueuer", "asyncpg")

    def __init__(self, case: Case) -> None:
        super().__init__(case)
        self.database: Database = Database.for_case(case, "pgqueuer")
        self.pool: Any = None
        self.queries: list[Any] = []

    def _env(self) -> None:
        os.environ["PGQUEUER_DURABILITY"] = DURABILITY

    async def open(self) -> None:
        import asyncpg
        from pgqueuer.db import AsyncpgDriver
        from pgqueuer.queries import Queries

        self._env()
        await self.database.create()
        self.durability = f"Postgres, durability={DURABILITY} (job table logged), {await self.database.durability()}"
        self.parts.postmaster, self.parts.database = self.database.postmaster, self.database.name
        self.pool = await asyncpg.create_pool(self.database.dsn, min_size=4, max_size=4)
        install = await asyncpg.connect(self.database.dsn)
        try:
            await Queries(AsyncpgDriver(install)).install()
        finally:
            await install.close()
        self.connections = [await self.pool.acquire() for _ in range(4)]
        self.queries = [Queries(AsyncpgDriver(conn)) for conn in self.connections]
        self.settings = {
            "worker": f"QueueManager.run({self._run_options()}) as pgq run does, asyncpg",
            "schema": f"durability={DURABILITY}",
            "submit": "Queries.enqueue with lists, chunks of 1000, 4 concurrent submitters (one connection each)",
        }

    def worker_commands(self) -> list[list[str]]:
        return [python_command("pgqueuer_peer") for _ in range(self.case.workers)]

    def _run_options(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in run_options(self.case.handler, self.case.concurrency).items())

    def worker_env(self) -> dict[str, str]:
        return {"PEERS_PGQ_DSN": self.database.dsn, "PEERS_HANDLER": self.case.handler,
                "PGQUEUER_DURABILITY": DURABILITY, "PEERS_CONCURRENCY": str(self.case.concurrency)}  # fmt: skip

    async def submit(self, stamps: list[float]) -> None:
        queries = self.queries.pop()  # one connection per concurrent submitter
        try:
            n = len(stamps)
            await queries.enqueue([ENTRYPOINT] * n, [repr(s).encode() if s else None for s in stamps], [0] * n)
        finally:
            self.queries.append(queries)

    async def close(self) -> None:
        if self.pool is not None:
            for conn in self.connections:
                await self.pool.release(conn)
            await self.pool.close()
        await self.database.drop()


# ---------------------------------------------------------------------------------------------
# Worker process: what ``pgq run peers.systems.pgqueuer_peer:factory --batch-size N`` does (the
# CLI of pgqueuer 1.6 fails to parse its own --log-level default), on uvloop as the CLI would.


async def factory() -> Any:
    import asyncpg
    from pgqueuer import PgQueuer as PgQueuerApp
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.models import Job

    connection = await asyncpg.connect(os.environ["PEERS_PGQ_DSN"])
    app = PgQueuerApp(AsyncpgDriver(connection))

    seconds = TASK_SECONDS[os.environ["PEERS_HANDLER"]]

    @app.entrypoint(ENTRYPOINT)
    async def bench(job: Job) -> None:
        await PROBE.run(float(job.payload) if job.payload else 0.0, seconds)

    return app


def run_options(handler: str, concurrency: int) -> dict[str, int]:
    if handler == "noop":
        return {"batch_size": BATCH_SIZE}
    return {"batch_size": max(1, concurrency // 2), "max_concurrent_tasks": max(2, concurrency)}


async def serve() -> None:
    app = await factory()
    await app.qm.run(**run_options(os.environ["PEERS_HANDLER"], int(os.environ["PEERS_CONCURRENCY"])))


def main() -> None:
    import uvloop

    uvloop.run(serve())


if __name__ == "__main__":
    main()
