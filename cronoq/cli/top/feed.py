"""The data behind ``cronoq top``: a poller thread for the listings and a watcher thread for events.

Each pane keeps its last good answer or the error of its last attempt, so a pane whose role the
token lacks, or a server that is changing leaders, shows why it is empty while the other panes
keep working; the next successful refresh replaces the error. The event stream reconnects by
itself with a growing pause.

On a sharded cluster the server merges every shard's events into one stream; a shard that cannot
be asked when the stream opens is left out of it (and named in its initial metadata). Such a
stream would never include that shard again, so once the listings show the shard answering,
the feed opens the stream again.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import grpc

from cronoq.proto import cronoq_pb2 as pb

from ..commands import stream_left_out
from ..connection import Connection
from ..exits import rpc_status

EVENTS_KEPT = 200
WAITING_STATUSES = (pb.TASK_STATUS_READY, pb.TASK_STATUS_RETRYING, pb.TASK_STATUS_SCHEDULED, pb.TASK_STATUS_BLOCKED)
RECONNECT_MIN_S = 0.2
RECONNECT_MAX_S = 5.0
REJOIN_EVERY_S = 5.0
"""Least time between two reopenings of the event stream to take in a shard that is back."""

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
    """Shards some pane could not ask: missing from a listing or from the event stream."""
    events_missing: list[str] = field(default_factory=list)
    """Shards whose events the current stream does not carry."""


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
        self.events_missing: list[str] = []
        self.tasks_missing: list[str] = []
        self.refreshed_at: float | None = None
        self._rejoining = False
        self._rejoined_at = 0.0
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
            if self.tasks.data is not None:
                shards.update(self.tasks_missing)
            if self.events_connected:
                shards.update(self.events_missing)
            return View(
                snapshot=Pane(self.snapshot.role, self.snapshot.data, self.snapshot.error),
                workers=Pane(self.workers.role, self.workers.data, self.workers.error),
                schedules=Pane(self.schedules.role, self.schedules.data, self.schedules.error),
                tasks=Pane(self.tasks.role, self.tasks.data, self.tasks.error),
                events=Pane(self.events.role, list(reversed(self._events)), self.events.error),
                refreshed_at=self.refreshed_at,
                events_connected=self.events_connected,
                unavailable_shards=sorted(shards),
                events_missing=list(self.events_missing) if self.events_connected else [],
            )

    # --- polling

    def _poll_loop(self) -> None:
        while not self.stopping.is_set():
            self.refresh_now.clear()
            self._poll_once()
            self.refresh_now.wait(self.interval)

    def _poll_once(self) -> None:
        empty = pb.Empty()
        # The shards each listing that answered could not ask; a shard absent from one of them answers.
        answered: list[set[str]] = []
        for pane, method in (
            (self.snapshot, self.conn.admin.Snapshot),
            (self.workers, self.conn.admin.ListWorkers),
            (self.schedules, self.conn.admin.ListRecurring),
        ):
            data = self._fetch(pane, lambda method=method: self._unary(method, empty))
            if data is not None:
                answered.append(set(data.unavailable_shards))
        if self._fetch(self.tasks, self._live_tasks) is not None:
            answered.append(set(self.tasks_missing))
        with self.lock:
            self.refreshed_at = time.time()
            self.version += 1
        self._rejoin_shards_back(answered)

    def _rejoin_shards_back(self, answered: list[set[str]]) -> None:
        """Reopen the event stream when a shard it left out answers the listings again."""
        with self.lock:
            missing = set(self.events_missing) if self.events_connected else set()
            back = any(missing - unavailable for unavailable in answered)
            stream = self._stream
            if not back or stream is None or time.monotonic() - self._rejoined_at < REJOIN_EVERY_S:
                return
            self._rejoining = True
            self._rejoined_at = time.monotonic()
        stream.cancel()  # the watch thread opens a new stream at once

    def _unary(self, method: Any, request: Any) -> Any:
        return method(request, metadata=self.conn.metadata, timeout=self.call_timeout)

    def _fetch(self, pane: Pane[Any], fetch: Any) -> Any:
        """Refresh ``pane``; its new data, or None when the call failed."""
        if self.stopping.is_set():
            return None
        try:
            data = fetch()
        except grpc.RpcError as e:
            error = describe_error(e, pane.role)
            with self.lock:
                pane.error = error
                self.version += 1
            return None
        with self.lock:
            pane.data = data
            pane.error = None
            self.version += 1
        return data

    def _live_tasks(self) -> list[pb.TaskInfo]:
        """Running tasks first, then waiting ones, at most ``task_limit`` in all."""
        found: list[pb.TaskInfo] = []
        missing: set[str] = set()
        for statuses in ((pb.TASK_STATUS_RUNNING,), WAITING_STATUSES):
            after = 0
            while len(found) < self.task_limit:
                request = pb.ListTasksRequest(
                    pools=self.pools, statuses=statuses, after=after, limit=self.task_limit - len(found)
                )
                page = self._unary(self.conn.tasks.ListTasks, request)
                found.extend(page.tasks)
                missing.update(page.unavailable_shards)
                if not page.next_after:
                    break
                after = page.next_after
        with self.lock:
            self.tasks_missing = sorted(missing)
        return found[: self.task_limit]

    # --- events

    def _watch_loop(self) -> None:
        pause = RECONNECT_MIN_S
        request = pb.WatchRequest(pools=self.pools, all_transitions=True)
        while not self.stopping.is_set():
            error: str | None = None
            try:
                stream = self.conn.tasks.Watch(request, metadata=self.conn.metadata)
                with self.lock:
                    self._stream = stream
                    self._rejoining = False
                if self.stopping.is_set():
                    stream.cancel()
                if self._still_open(stream):
                    # Refusals (role, leader) end the call at once; one still open is connected.
                    self._set_events_state(connected=True, error=None, missing=stream_left_out(stream))
                for event in stream:
                    pause = RECONNECT_MIN_S  # the stream works: reconnect quickly if it drops later
                    with self.lock:
                        self._events.append(event)
                        self.version += 1
                error = "the server ended the event stream; reconnecting"
            except grpc.RpcError as e:
                if self.stopping.is_set():
                    return
                with self.lock:
                    rejoining, self._rejoining = self._rejoining, False
                if rejoining:  # cancelled by us to take in a shard that is back: reopen at once
                    pause = RECONNECT_MIN_S
                    continue
                error = describe_error(e, self.events.role)
            finally:
                with self.lock:
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

    def _set_events_state(self, *, connected: bool, error: str | None, missing: list[str] | None = None) -> None:
        with self.lock:
            self.events_connected = connected
            self.events_missing = missing or []
            self.events.error = error
            self.version += 1
