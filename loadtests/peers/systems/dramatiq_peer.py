"""Dramatiq with the Redis broker: the ``dramatiq`` CLI with ``--processes``, ``send`` per message.

Configuration (see loadtests/peers/README.md): ``RedisBroker`` in a namespace of the run's own,
the ``AsyncIO`` middleware so the actor is an ``async def`` like everyone else's, and no result
backend. One ``dramatiq`` command starts all ``workers`` processes (its documented way to run
several); each has ``THREADS`` worker threads for no-op tasks (Dramatiq's default, 8) and
``concurrency`` threads for the 10 ms tasks (an async actor holds its thread while it awaits).
Prefetch is Dramatiq's default (twice the threads). Dramatiq has no batch enqueue: the producer
calls ``send`` per message from ``SUBMITTERS`` threads.

This module is also what the workers load (``dramatiq peers.systems.dramatiq_peer``); it reads
the broker URL, namespace and handler from the environment.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from peers.probe import PROBE, TASK_SECONDS
from peers.systems.base import Case, System, redis_delete_matching, redis_persistence

QUEUE = "bench"
THREADS = 8


def make_broker(url: str, namespace: str, handler: str) -> Any:
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker
    from dramatiq.middleware.asyncio import AsyncIO

    broker = RedisBroker(url=url, namespace=namespace)
    broker.add_middleware(AsyncIO())
    dramatiq.set_broker(broker)

    seconds = TASK_SECONDS[handler]

    @dramatiq.actor(actor_name="bench", queue_name=QUEUE, max_retries=0)
    async def bench(stamp: float) -> None:
        await PROBE.run(stamp, seconds)

    return broker


class Dramatiq(System):
    name = "dramatiq"
    backend = "redis"
    libraries = ("dramatiq", "redis")

    def __init__(self, case: Case) -> None:
        super().__init__(case)
        self.namespace = f"peers-dramatiq-{case.run_id}"
        self.parts.redis = True
        self.broker: Any = None

    def _threads(self) -> int:
        return self.case.concurrency if self.case.handler == "sleep10" else THREADS

    async def open(self) -> None:
        self.durability = await redis_persistence(self.case.redis_url)
        self.broker = make_broker(self.case.redis_url, self.namespace, "noop")
        self.settings = {
            "worker": f"dramatiq --processes {self.case.workers} --threads {self._threads()}, AsyncIO middleware, "
                      "async actor, default prefetch",
            "submit": "Actor.send per message, from 4 threads",
        }  # fmt: skip

    def worker_commands(self) -> list[list[str]]:
        return [[sys.executable, "-m", "dramatiq", "peers.systems.dramatiq_peer", "--processes",
                 str(self.case.workers), "--threads", str(self._threads()), "--queues", QUEUE]]  # fmt: skip

    def worker_env(self) -> dict[str, str]:
        return {"PEERS_REDIS_URL": self.case.redis_url, "PEERS_NAMESPACE": self.namespace,
                "PEERS_HANDLER": self.case.handler}  # fmt: skip

    async def submit(self, stamps: list[float]) -> None:
        actor = self.broker.get_actor("bench")

        def send() -> None:
            for stamp in stamps:
                actor.send(stamp)

        await asyncio.to_thread(send)

    async def close(self) -> None:
        if self.broker is not None:
            self.broker.close()
        await redis_delete_matching(self.case.redis_url, [f"{self.namespace}*"])


# The broker ``dramatiq peers.systems.dramatiq_peer`` loads.
if "PEERS_NAMESPACE" in os.environ:
    broker = make_broker(os.environ["PEERS_REDIS_URL"], os.environ["PEERS_NAMESPACE"], os.environ["PEERS_HANDLER"])
