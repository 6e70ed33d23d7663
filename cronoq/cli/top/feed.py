"""The data behind ``cronoq top``: a poller thread for the listings and a watcher thread for events.

Each pane keeps its last good answer or the error of its last attempt, so a pane whose role the
token lacks, or a server that is changing leaders, shows why it is empty while the other panes
keep working; the next successful refresh replaces the error. The event stream reconnects by
itself with a growing pause.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import grpc

from cronoq.proto import cronoq_pb2 as pb

from ..connection import Connection
from ..exits import rpc_status

EVENTS_KEPT = 200
WAITING_STATUSES = (pb.TASK_STATUS_READY, pb.TASK_STATUS_RETRYING, pb.TASK_STATUS_SCHEDULED, pb.TASK_STATUS_BLOCKED)
RECONNECT_MIN_S = 0.2
RECONNECT_MAX_S = 5.0

T = TypeVar("T")


@dataclass
class Pane(Generic[T]):
    """The last answer for one pane (``data``) and, when the last attempt failed, why (``error``)."""

    role: str
    data: T | None = None
    error: str | None = None


def describe_error(error: grpc.RpcError, role: str) -> str:
    """What a pane says when its call failed: the missing role, bad credentials, or the status."""
    code, details = rpc_status(error)
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return f"needs the {role} role: the token is not allowed to see this ({details})"
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return f"not authenticated ({details}): set CRONOQ_TOKEN to a token with the {role} role"
    name = code.name.lower() if code is not None else "error"
    return f"{name}: {details or 'no details'} (retrying)"


@dataclass
class View:
    """A consistent copy of everything the screen shows, taken under the feed's lock."""

    snapshot: Pane[pb.SnapshotResponse]
    workers: Pane[pb.ListWorkersResponse]
    schedules: Pane[pb.ListRecurringResponse]
    tasks: Pane[list[pb.TaskInfo]]
    events: Pane[list[pb.StatusEvent]]
    refreshed_at: float | None
    events_connected: bool
    unavailable_shards: list[str] = field(default_factory=list)


class Feed:
    def __init__(self, conn: Connection, *, pools: list[str], task_limit: int, interval: float) -> None:
        self.conn = conn
        self.pools = pools
        self.task_limit = task_limit
        self.interval = interval
        self.call_timeout = min(10.0, max(2.0, 3 * interval))
        self.lock = threading.Lock()
        self.version = 0
        self.snapshot: Pane[pb.SnapshotResponse] = Pane("metrics")
        self.workers: Pane[pb.ListWorkersResponse] = Pane("metrics")
        self.schedules: Pane[pb.ListRecurringResponse] = Pane("metrics")
        self.tasks: Pane[list[pb.TaskInfo]] = Pane("client")
        self.events: Pane[list[pb.StatusEvent]] = Pane("client", data=[])
        self._events: deque[pb.StatusEvent] = deque(maxlen=EVENTS_KEPT)
        self.events_connected = False
        self.refreshed_at: float | None = None
        self.refresh_now = threading.Event()
        self.stopping = threading.Event()
        self._watch_wake = threading.Event()
        self._stream: Any = None
        self._threads = [
            threading.Thread(target=self._poll_loop, name="cronoq-top-poll", daemon=True),
            threading.Thread(target=self._watch_loop, name="cronoq-top-watch", daemon=True),
        ]

    # --- lifecycle

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.refresh_now.set()
        self._watch_wake.set()
        stream = self._stream
        if stream is not None:
            stream.cancel()
        for thread in self._threads:
            thread.join(timeout=self.call_timeout + 1.0)

    def refresh(self) -> None:
        """Refresh every pane now and, if the event stream is down, reconnect it at once."""
        self.refresh_now.set()
        self._watch_wake.set()

    def view(self) -> View:
        with self.lock:
            shards: set[str] = set()
            for pane in (self.snapshot, self.workers, self.schedules):
                if pane.data is not None:
                    shards.update(pane.data.unavailable_shards)
            return View(
                snapshot=Pane(self.snapshot.role, self.snapshot.data, self.snapshot.error),
                workers=Pane(self.workers.role, self.workers.data, self.workers.error),
                schedules=Pane(self.schedules.role, self.schedules.data, self.schedules.error),
                tasks=Pane(self.tasks.role, self.tasks.data, self.tasks.error),
                events=Pane(self.events.role, list(reversed(self._events)), self.events.error),
                refreshed_at=self.refreshed_at,
                events_connected=self.events_connected,
                unavailable_shards=sorted(shards),
            )

    # --- polling

    def _poll_loop(self) -> None:
        while not self.stopping.is_set():
            self.refresh_now.clear()
            self._poll_once()
            self.refresh_now.wait(self.interval)

    def _poll_once(self) -> None:
        empty = pb.Empty()
        self._fetch(self.snapshot, lambda: self._unary(self.conn.admin.Snapshot, empty))
        self._fetch(self.workers, lambda: self._unary(self.conn.admin.ListWorkers, empty))
        self._fetch(self.schedules, lambda: self._unary(self.conn.admin.ListRecurring, empty))
        self._fetch(self.tasks, self._live_tasks)
        with self.lock:
            self.refreshed_at = time.time()
            self.version += 1

    def _unary(self, method: Any, request: Any) -> Any:
        return method(request, metadata=self.conn.metadata, timeout=self.call_timeout)

    def _fetch(self, pane: Pane[Any], fetch: Any) -> None:
        if self.stopping.is_set():
            return
        try:
            data = fetch()
        except grpc.RpcError as e:
            error = describe_error(e, pane.role)
            with self.lock:
                pane.error = error
                self.version += 1
            return
        with self.lock:
            pane.data = data
            pane.error = None
            self.version += 1

    def _live_tasks(self) -> list[pb.TaskInfo]:
        """Running tasks first, then waiting ones, at most ``task_limit`` in all."""
        found: list[pb.TaskInfo] = []
        for statuses in ((pb.TASK_STATUS_RUNNING,), WAITING_STATUSES):
            after = 0
            while len(found) < self.task_limit:
                request = pb.ListTasksRequest(
                    pools=self.pools, statuses=statuses, after=after, limit=self.task_limit - len(found)
                )
                page = self._unary(self.conn.tasks.ListTasks, request)
                found.extend(page.tasks)
                if not page.next_after:
                    break
                after = page.next_after
        return found[: self.task_limit]

    # --- events

    def _watch_loop(self) -> None:
        pause = RECONNECT_MIN_S
        request = pb.WatchRequest(pools=self.pools, all_transitions=True)
        while not self.stopping.is_set():
            error: str | None = None
            try:
                stream = self.conn.tasks.Watch(request, metadata=self.conn.metadata)
                self._stream = stream
                if self.stopping.is_set():
                    stream.cancel()
                if self._still_open(stream):
                    # Refusals (role, leader) end the call at once; one still open is connected.
                    self._set_events_state(connected=True, error=None)
                for event in stream:
                    pause = RECONNECT_MIN_S  # the stream works: reconnect quickly if it drops later
                    with self.lock:
                        self._events.append(event)
                        self.version += 1
                error = "the server ended the event stream; reconnecting"
            except grpc.RpcError as e:
                if self.stopping.is_set():
                    return
                error = describe_error(e, self.events.role)
            finally:
                self._stream = None
            self._set_events_state(connected=False, error=error)
            self._watch_wake.clear()
            self._watch_wake.wait(pause)
            pause = min(pause * 2, RECONNECT_MAX_S)

    @staticmethod
    def _still_open(stream: Any, settle_s: float = 0.5) -> bool:
        deadline = time.monotonic() + settle_s
        while not stream.done() and time.monotonic() < deadline:
            time.sleep(0.05)
        return not stream.done()

    def _set_events_state(self, *, connected: bool, error: str | None) -> None:
        with self.lock:
            self.events_connected = connected
            self.events.error = error
            self.version += 1
