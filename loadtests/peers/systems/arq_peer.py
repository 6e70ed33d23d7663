"""arq on Redis: ``arq.worker.Worker`` processes, ``ArqRedis.enqueue_job`` per job.

Configuration (see loadtests/peers/README.md): ``max_jobs`` = ``concurrency`` (64, the slots of
a cronoq worker; arq's default is 10), ``poll_delay`` ``POLL_DELAY_S`` instead of the default
0.5 s (arq polls its queue; nothing wakes an idle worker), ``queue_read_limit`` left at its
default (5 x max_jobs), results not kept (``keep_result=0``) and not logged. arq has no batch
enqueue: the producer runs ``IN_FLIGHT`` ``enqueue_job`` calls at once over one connection pool.
"""

from __future__ import annotations

import os
from typing import Any

from peers.probe import PROBE, TASK_SECONDS
from peers.systems.base import Case, System, bounded_gather, python_command, redis_delete_matching, redis_persistence

POLL_DELAY_S = 0.01
IN_FLIGHT = 64


async def bench(ctx: dict[str, Any], stamp: float) -> None:
    await PROBE.run(stamp, TASK_SECONDS[os.environ["PEERS_HANDLER"]])


class Arq(System):
    name = "arq"
    backend = "redis"
    libraries = ("arq", "redis")

    def __init__(self, case: Case) -> None:
        super().__init__(case)
        self.queue = f"arq:peers-{case.run_id}"
        self.parts.redis = True
        self.pool: Any = None
        self.sent = 0

    async def open(self) -> None:
        from arq import create_pool
        from arq.connections import RedisSettings

        self.durability = await redis_persistence(self.case.redis_url)
        self.pool = await create_pool(RedisSettings.from_dsn(self.case.redis_url), default_queue_name=self.queue)
        self.settings = {
            "worker": f"arq Worker(max_jobs={self.case.concurrency}, poll_delay={POLL_DELAY_S}, keep_result=0, "
                      "log_results=False)",
            "submit": f"ArqRedis.enqueue_job per job, {IN_FLIGHT} in flight",
        }  # fmt: skip

    def worker_commands(self) -> list[list[str]]:
        return [python_command("arq_peer") for _ in range(self.case.workers)]

    def worker_env(self) -> dict[str, str]:
        return {"PEERS_REDIS_URL": self.case.redis_url, "PEERS_QUEUE": self.queue, "PEERS_HANDLER": self.case.handler,
                "PEERS_CONCURRENCY": str(self.case.concurrency)}  # fmt: skip

    async def submit(self, stamps: list[float]) -> None:
        base, self.sent = self.sent, self.sent + len(stamps)
        # Job ids carry the run id so that close() can find what a timed-out case left behind.
        run = self.case.run_id
        calls = [self.pool.enqueue_job("bench", stamp, _job_id=f"{run}-{base + n}")
                 for n, stamp in enumerate(stamps)]  # fmt: skip
        await bounded_gather(calls, IN_FLIGHT)

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.aclose()
        await redis_delete_matching(self.case.redis_url, [f"arq:*{self.case.run_id}*"])


# ---------------------------------------------------------------------------------------------
# Worker process


def main() -> None:
    import logging

    from arq.connections import RedisSettings
    from arq.worker import Worker

    logging.basicConfig(level=logging.WARNING)
    worker = Worker(
        functions=[bench],
        queue_name=os.environ["PEERS_QUEUE"],
        redis_settings=RedisSettings.from_dsn(os.environ["PEERS_REDIS_URL"]),
        max_jobs=int(os.environ["PEERS_CONCURRENCY"]),
        poll_delay=POLL_DELAY_S,
        keep_result=0,
        log_results=False,
    )
    worker.run()


if __name__ == "__main__":
    main()
