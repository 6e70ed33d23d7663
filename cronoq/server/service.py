"""The shard service as the server runs it: one policy added on top of ``ShardService``.

A lease that expires while its worker's stream is still open means the worker stopped
heartbeating: its process is frozen, stuck or cut off in a way TCP has not noticed yet. Such a
worker would otherwise keep its free slot and be offered the very retry of the attempt it just
lost. The server therefore disconnects a worker as soon as one of its leases expires: the
retry goes to another worker, the worker's other leases fail as retryable, and a worker that
is merely slow reconnects on its own.
"""

from __future__ import annotations

from collections.abc import Sequence

from cronoq.engine import Abort
from cronoq.shard.service import ShardService
from cronoq.shard.workers import WorkerSession

__all__ = ["LEASE_EXPIRED", "ServerShardService"]

LEASE_EXPIRED = "lease expired"
"""The engine's abort reason for a lease without a heartbeat within its TTL."""


class ServerShardService(ShardService):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.closed_reasons: dict[int, str] = {}

    def abort(self, aborts: Sequence[Abort]) -> None:
        stalled: list[WorkerSession] = []
        for abort in aborts:
            if abort.reason == LEASE_EXPIRED:
                session = self.workers.lease_owner.get(abort.lease_id)
                if session is not None and session not in stalled:
                    stalled.append(session)
        super().abort(aborts)
        # Before anything of this step is dispatched: the expired lease's retry must not go back
        # to the worker that let it expire.
        for session in stalled:
            reason = "a lease expired without a heartbeat"
            self.closed_reasons[session.id] = reason
            self.unregister_worker(session, reason)

    def close_reason(self, session: WorkerSession) -> str | None:
        return self.closed_reasons.pop(session.id, None)
