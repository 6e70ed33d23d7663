"""pgqueuer on Postgres: ``pgq run`` worker processes, ``Queries.enqueue`` with lists for batches.

Configuration (see loadtests/peers/README.md for why): schema installed with durability
``balanced`` (the job table is logged, only the log and statistics tables are unlogged), each
worker runs ``QueueManager.run(batch_size=BATCH_SIZE)`` as ``pgq run`` would, with an asyncpg
connection, one entrypoint with no concurrency limit; jobs arrive by LISTEN/NOTIFY.
The producer enqueues each chunk with one ``enqueue`` call of lists (one statement), over an
asyncpg pool of one connection per concurrent submitter.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from peers.probe import PROBE
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
        self.database = Database.for_case(case, "pgqueuer")
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
        durability = await self.database.settings()
        self.durability = f"Postgres, durability={DURABILITY} (job table logged), fsync={durability['fsync']}, " \
                          f"synchronous_commit={durability['synchronous_commit']}"  # fmt: skip
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
            "worker": f"QueueManager.run(batch_size={BATCH_SIZE}) as pgq run does, asyncpg, "
            "entrypoint without concurrency limit",
            "schema": f"durability={DURABILITY}",
            "submit": "Queries.enqueue with lists, chunks of 1000, 4 concurrent submitters (one connection each)",
        }

    def worker_commands(self) -> list[list[str]]:
        return [python_command("pgqueuer_peer") for _ in range(self.case.workers)]

    def worker_env(self) -> dict[str, str]:
        return {"PEERS_PGQ_DSN": self.database.dsn, "PEERS_HANDLER": self.case.handler,
                "PGQUEUER_DURABILITY": DURABILITY}  # fmt: skip

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

    if os.environ.get("PEERS_HANDLER") == "sleep10":

        @app.entrypoint(ENTRYPOINT)
        async def sleep10(job: Job) -> None:
            PROBE.started(float(job.payload) if job.payload else 0.0)
            await asyncio.sleep(0.01)
            PROBE.finished()

    else:

        @app.entrypoint(ENTRYPOINT)
        async def noop(job: Job) -> None:
            PROBE.started(float(job.payload) if job.payload else 0.0)
            PROBE.finished()

    return app


async def serve() -> None:
    app = await factory()
    await app.qm.run(batch_size=BATCH_SIZE)


def main() -> None:
    import uvloop

    uvloop.run(serve())


if __name__ == "__main__":
    main()
