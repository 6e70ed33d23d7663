"""cronoq embedded: ``cronoq.Scheduler`` with a ``PostgresStore`` in the driver's own process.

The same path as ``loadtests/store_bench.py``: one pool of ``workers * concurrency`` slots (256
by default) with an async executor, or ``NOOP_SLOTS`` for tasks that do nothing, tasks submitted with
``Scheduler.submit_batch``. Submitter, engine and executors share one process, so its CPU is all
reported as the ``client`` part. For the backlog the pool's capacity is 0 until the driver starts
consuming.
"""

from __future__ import annotations

from typing import Any

from peers.probe import TASK_SECONDS, Probe
from peers.systems.base import Case, Database, System

POOL = "default"
NOOP_SLOTS = 512
"""Slots of the pool when tasks do nothing: what the remote row's server grants its workers at most
(the pool's ``max`` in server_bench's configuration), while pgqueuer's no-op jobs run uncapped,
500 fetched at a time by each of its workers. Every slot freed by one step is refilled by one
commit, so the slots bound the tasks per commit (loadtests/peers/README.md)."""


class CronoqInProcess(System):
    name = "cronoq-inprocess"
    backend = "postgres"
    in_process = True
    libraries = ("asyncpg",)

    def __init__(self, case: Case) -> None:
        super().__init__(case)
        self.database: Database = Database.for_case(case, "cronoqip")
        self.probe = Probe(report=False)
        self.scheduler: Any = None
        self.slots = NOOP_SLOTS if case.handler == "noop" else case.workers * case.concurrency

    async def open(self) -> None:
        from cronoq.stores.postgres import PostgresStore

        import cronoq

        await self.database.create()
        self.durability = f"Postgres commit per batch, {await self.database.durability()}"
        self.parts.postmaster, self.parts.database = self.database.postmaster, self.database.name
        probe, seconds = self.probe, TASK_SECONDS[self.case.handler]

        async def execute(ctx: cronoq.TaskContext, stamp: float) -> None:
            await probe.run(stamp, seconds)

        store = PostgresStore(self.database.dsn, schema="cronoq_bench")
        pool = cronoq.Pool(POOL, execute, max=self.slots, autoscale=False)
        self.scheduler = cronoq.Scheduler([pool], store=store)
        await self.scheduler.start()
        await self.scheduler.set_capacity(POOL, 0)
        self.settings = {
            "scheduler": f"cronoq.Scheduler, PostgresStore, one pool of {self.slots} slots",
            "submit": "Scheduler.submit_batch, chunks of 1000, 4 concurrent submitters",
        }

    async def start_consuming(self) -> None:
        await self.scheduler.set_capacity(POOL, self.slots)

    async def submit(self, stamps: list[float]) -> None:
        import cronoq

        await self.scheduler.submit_batch([cronoq.Task(stamp) for stamp in stamps])

    def completed(self) -> int:
        return self.probe.done

    def span(self) -> tuple[float, float]:
        return self.probe.first, self.probe.last

    def take_latencies_ms(self) -> list[float]:
        return self.probe.take_latencies_ms()

    async def close(self) -> None:
        if self.scheduler is not None:
            await self.scheduler.shutdown(grace=0)
        await self.database.drop()
