"""A producer process of a drill: submits tasks at a steady rate with ``cronoq.client`` and records
each submission in the ledger.

Every task has a key, so a try that failed with UNAVAILABLE (or timed out, leaving the outcome
unknown) is sent again with the same key: the server answers with the task the first try created
(``duplicate``) instead of making a second one. A submission counts as acknowledged once a try
returned a task id. Every ``dep_every``-th task gets a child submitted after it, which runs only
once the parent succeeded (the checker verifies the order).

Run as ``python -m cronoq.chaos.producer PLAN.json``; the bearer token comes from ``CRONOQ_TOKEN``.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cronoq.client import Client, ClientError

from .ledger import KEEPALIVE, Ledger, Submission

__all__ = ["ProducerPlan", "main"]

RETRYABLE = frozenset(
    {"unavailable", "resource_exhausted", "deadline_exceeded", "cancelled", "unknown", "internal", "aborted"}
)
"""Codes after which the submission's fate is unknown or transient: try again with the same key.
``cancelled`` is among them: the producer never cancels a call, but a server that loses its
leadership cancels the calls it had received and not yet started (the drills record how often)."""
CALL_TIMEOUT_S = 5.0
FLUSH_EVERY_S = 0.25


@dataclass(frozen=True, slots=True)
class ProducerPlan:
    name: str
    target: str
    ledger: str
    pool: str
    count: int
    rate: float
    """Tasks per second this producer submits (children included)."""
    seed: int
    key_prefix: str
    dep_every: int = 0
    """Every n-th task gets a dependent child (0: none)."""
    max_attempts: int = 10
    task_timeout_s: float | None = None
    work_s: float = 0.01
    slow_fraction: float = 0.0
    """Share of tasks whose first attempt runs ``slow_s`` (past ``task_timeout_s``)."""
    slow_s: float = 0.0
    retry_for_s: float = 120.0
    """How long one submission is retried before it is given up (and recorded unacknowledged)."""
    max_in_flight: int = 64

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def read(cls, path: Path) -> ProducerPlan:
        return cls(**json.loads(path.read_text()))


class Producer:
    def __init__(self, plan: ProducerPlan, token: str | None) -> None:
        self.plan = plan
        self.client = Client(plan.target, token=token, options=KEEPALIVE)
        self.ledger = Ledger(plan.ledger)
        self.rng = random.Random(plan.seed)
        self._pending: list[Submission] = []
        self._errors: list[tuple[str, float, str]] = []
        self._slots = asyncio.Semaphore(plan.max_in_flight)
        self._stop = asyncio.Event()

    def _spec(self, key: str, parent: int | None) -> dict[str, Any]:
        plan = self.plan
        slow = plan.slow_fraction > 0 and self.rng.random() < plan.slow_fraction
        opts: dict[str, Any] = {
            "pool": plan.pool,
            "key": key,
            "retry": {"max_attempts": plan.max_attempts, "initial_backoff": 0.05, "max_backoff": 0.5},
        }
        if plan.task_timeout_s is not None:
            opts["timeout"] = plan.task_timeout_s
        if parent is not None:
            opts["after"] = parent
        opts["payload"] = {"work": plan.work_s, "slow": plan.slow_s if slow else 0.0}
        return opts

    async def _submit(self, seq: int, key: str, parent_key: str | None, parent: int | None) -> int | None:
        plan = self.plan
        opts = self._spec(key, parent)
        sent = time.time()
        give_up = time.monotonic() + plan.retry_for_s
        tries = 0
        error: str | None = None
        delay = 0.05
        while True:
            tries += 1
            try:
                submitted = await self.client.submit(call_timeout=CALL_TIMEOUT_S, **opts)
            except (ClientError, TimeoutError) as exc:
                code = exc.code if isinstance(exc, ClientError) else "deadline_exceeded"
                self._errors.append((plan.name, time.time(), code))
                error = str(exc)[:300]
                if code not in RETRYABLE or time.monotonic() + delay > give_up or self._stop.is_set():
                    break
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.5)
                continue
            self._pending.append(
                Submission(
                    plan.name,
                    seq,
                    key,
                    plan.pool,
                    parent_key,
                    submitted.id,
                    True,
                    submitted.duplicate,
                    tries,
                    sent,
                    time.time(),
                    None,
                )
            )
            return submitted.id
        self._pending.append(Submission(plan.name, seq, key, plan.pool, parent_key, None, False, False, tries, sent,
                                        None, error))  # fmt: skip
        return None

    async def _one(self, seq: int) -> None:
        try:
            key = f"{self.plan.key_prefix}-{seq}"
            parent = await self._submit(seq, key, None, None)
            if parent is not None and self.plan.dep_every and seq % self.plan.dep_every == 0:
                await self._submit(-seq - 1, f"{key}-child", key, parent)
        finally:
            self._slots.release()

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_EVERY_S)
            self._flush()

    def _flush(self) -> None:
        rows, self._pending = self._pending, []
        errors, self._errors = self._errors, []
        self.ledger.add_submissions(rows)
        self.ledger.add_client_errors(errors)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self._stop.set)
        flusher = asyncio.ensure_future(self._flush_loop())
        interval = 1.0 / self.plan.rate if self.plan.rate > 0 else 0.0
        started = loop.time()
        jobs: set[asyncio.Task[None]] = set()
        try:
            for seq in range(self.plan.count):
                if self._stop.is_set():
                    break
                wait = started + seq * interval - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                await self._slots.acquire()
                job = asyncio.ensure_future(self._one(seq))
                jobs.add(job)
                job.add_done_callback(jobs.discard)
            if jobs:
                await asyncio.gather(*jobs)
        finally:
            flusher.cancel()
            self._flush()
            await self.client.close()
            self.ledger.close()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m cronoq.chaos.producer PLAN.json", file=sys.stderr)
        return 2
    plan = ProducerPlan.read(Path(args[0]))
    asyncio.run(Producer(plan, os.environ.get("CRONOQ_TOKEN")).run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
