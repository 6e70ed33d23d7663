"""Celery with the Redis broker: ``celery worker`` processes, ``apply_async`` per task.

Configuration (see loadtests/peers/README.md): results ignored (no result backend), rate limits
disabled, the worker started ``--without-gossip --without-mingle --without-heartbeat`` (the
cluster chatter a benchmark does not need), one queue of the run's own. Celery runs no
coroutines, so the 10 ms task is ``time.sleep(0.01)`` on the ``threads`` pool (``concurrency``
threads per process); no-op tasks run on the ``solo`` pool (the task runs in the worker's own
process: no hand-off to a child). Celery has no batch publish: the producer calls
``apply_async`` per task from ``SUBMITTERS`` threads.

This module is also the Celery app the workers load (``celery -A peers.systems.celery_peer``);
it reads the broker URL, queue and handler from the environment.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from peers.probe import PROBE, TASK_SECONDS
from peers.systems.base import Case, System, redis_delete_matching, redis_persistence

UNACKED_KEYS = ("unacked", "unacked_index", "unacked_mutex")
PREFETCH_MULTIPLIER = 16  # messages each worker process reserves per execution slot (README)


def make_app(broker: str, queue: str, handler: str) -> Any:
    from celery import Celery

    app = Celery("peers", broker=broker)
    app.conf.update(
        task_ignore_result=True,
        task_default_queue=queue,
        worker_prefetch_multiplier=PREFETCH_MULTIPLIER,
        worker_disable_rate_limits=True,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        # Kombu keeps delivered, not yet acknowledged messages in Redis keys shared by every queue
        # of the database; keys named after the run's queue are found and deleted with it (a worker
        # stopped with messages in them would otherwise leave them for the next run to restore).
        broker_transport_options={f"{name}_key": f"{queue}-{name}" for name in UNACKED_KEYS},
    )

    seconds = TASK_SECONDS[handler]

    @app.task(name="bench")
    def bench(stamp: float) -> None:
        PROBE.run_blocking(stamp, seconds)

    return app


class Celery(System):
    name = "celery"
    backend = "redis"
    libraries = ("celery", "redis")

    def __init__(self, case: Case) -> None:
        super().__init__(case)
        self.queue = f"peers-celery-{case.run_id}"
        self.parts.redis = True
        self.app: Any = None

    def _pool(self) -> tuple[str, int]:
        return ("threads", self.case.concurrency) if self.case.handler == "sleep10" else ("solo", 1)

    async def open(self) -> None:
        self.durability = await redis_persistence(self.case.redis_url)
        self.app = make_app(self.case.redis_url, self.queue, "noop")
        pool, concurrency = self._pool()
        self.settings = {
            "worker": f"celery worker --pool={pool} --concurrency={concurrency} --without-gossip --without-mingle "
                      f"--without-heartbeat, prefetch multiplier {PREFETCH_MULTIPLIER}, task_ignore_result",
            "submit": "Task.apply_async per task, from 4 threads",
        }  # fmt: skip

    def worker_commands(self) -> list[list[str]]:
        pool, concurrency = self._pool()
        celery = [sys.executable, "-m", "celery", "-A", "peers.systems.celery_peer", "worker", "-Q", self.queue,
                  f"--pool={pool}", f"--concurrency={concurrency}", "--without-gossip", "--without-mingle",
                  "--without-heartbeat", "--loglevel=WARNING"]  # fmt: skip
        return [[*celery, "-n", f"peer{n}@%h"] for n in range(self.case.workers)]

    def worker_env(self) -> dict[str, str]:
        return {"PEERS_REDIS_URL": self.case.redis_url, "PEERS_QUEUE": self.queue, "PEERS_HANDLER": self.case.handler}

    async def submit(self, stamps: list[float]) -> None:
        task = self.app.tasks["bench"]

        def publish() -> None:
            for stamp in stamps:
                task.apply_async((stamp,))

        await asyncio.to_thread(publish)

    async def close(self) -> None:
        if self.app is not None:
            self.app.close()
        await redis_delete_matching(self.case.redis_url, [f"*{self.case.run_id}*"])


# The app ``celery -A peers.systems.celery_peer worker`` loads.
if "PEERS_QUEUE" in os.environ:
    app = make_app(os.environ["PEERS_REDIS_URL"], os.environ["PEERS_QUEUE"], os.environ["PEERS_HANDLER"])
