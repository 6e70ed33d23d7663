"""``Client``: submit tasks and follow them over the Tasks and Admin services."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio

from cronoq._client.channel import auth_metadata, open_channel, wants_tls, with_keepalive
from cronoq._client.coalesce import SubmitCoalescer
from cronoq._client.common import Payload, TaskRef
from cronoq._client.encoding import (
    OVERLAPS,
    TaskSpecOptions,
    from_table,
    refuse_single_string,
    status_to_wire,
    task,
    task_ref_to_wire,
    to_seconds,
)
from cronoq._client.errors import rpc_error
from cronoq._client.results import Event, RecurringInfo, Result, Snapshot, Submitted, TaskInfo, TaskPage, WorkerInfo
from cronoq._client.tracing import trace_metadata
from cronoq.proto import cronoq_pb2 as pb
from cronoq.proto import cronoq_pb2_grpc

if TYPE_CHECKING:
    from typing_extensions import Unpack

# The generated service module carries no annotations.
pb_grpc: Any = cronoq_pb2_grpc

COALESCE_CALLS = 4
"""Submit/SubmitBatch calls a coalescing client keeps in flight for its single submits."""
COALESCE_MAX_TASKS = 500
"""Most submits merged into one SubmitBatch (within the server's default ``max_tasks_per_batch``)."""
COALESCE_MAX_BYTES = 2 << 20
"""Most task bytes merged into one SubmitBatch (within gRPC's default 4 MiB message limit)."""


class Client:
    """Submit tasks to a cronoq server and follow them (``cronoq.v1.Tasks`` and ``Admin``).

    Use as ``async with Client("localhost:7070", token=...) as c: ...`` or call ``close()``.

    ``coalesce=True`` merges concurrent ``submit`` calls into SubmitBatch calls transparently,
    each caller still getting its own answer or error (``cronoq._client.coalesce``): for a
    producer that submits many tasks one by one from many coroutines.

    While a call is open the channel pings the server (``cronoq._client.channel.KEEPALIVE``), so a
    call without a deadline on a frozen server ends UNAVAILABLE instead of waiting; ``options`` set
    by the caller take precedence over those settings.
    """

    def __init__(
        self,
        target: str,
        *,
        token: str | None = None,
        tls: bool = False,
        credentials: grpc.ChannelCredentials | None = None,
        options: Sequence[tuple[str, Any]] | None = None,
        coalesce: bool = False,
    ) -> None:
        self.target = target
        self.coalesce = coalesce
        self._token = token or None
        self._secure = wants_tls(target, tls, credentials)
        self._credentials = credentials
        self._options = with_keepalive(options or ())
        self._metadata = auth_metadata(self._token)
        self._channel: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: Any = None
        self._admin: Any = None
        self._coalescer: SubmitCoalescer | None = None

    def __repr__(self) -> str:
        return f"Client({self.target!r})"

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _stubs(self) -> tuple[Any, Any]:
        loop = asyncio.get_running_loop()
        if self._channel is None or self._loop is not loop:
            self._channel = open_channel(
                self.target, secure=self._secure, credentials=self._credentials, options=self._options
            )
            self._loop = loop
            self._tasks = pb_grpc.TasksStub(self._channel)
            self._admin = pb_grpc.AdminStub(self._channel)
            self._coalescer = None  # its futures belonged to the previous loop
        return self._tasks, self._admin

    def _submit_coalescer(self) -> SubmitCoalescer:
        self._stubs()
        if self._coalescer is None:
            self._coalescer = SubmitCoalescer(
                lambda request: self._call("tasks", "Submit", request),
                lambda batch: self._call("tasks", "SubmitBatch", batch),
                calls=COALESCE_CALLS,
                max_tasks=COALESCE_MAX_TASKS,
                max_bytes=COALESCE_MAX_BYTES,
            )
        return self._coalescer

    async def close(self) -> None:
        """Close the channel (a later call opens a new one)."""
        channel, loop, coalescer = self._channel, self._loop, self._coalescer
        self._channel = self._loop = self._tasks = self._admin = self._coalescer = None
        if channel is not None and loop is asyncio.get_running_loop():
            if coalescer is not None:
                await coalescer.close()
            await channel.close()

    def _call_metadata(self) -> tuple[tuple[str, str], ...] | None:
        """Authorization plus, while an OpenTelemetry span is active, its trace context, so the
        server links what the call does (e.g. the tasks it admits) to the caller's trace."""
        traced = trace_metadata()
        if not traced:
            return self._metadata
        return (*(self._metadata or ()), *traced)

    async def _call(self, service: str, method: str, request: Any, timeout: float | None = None) -> Any:
        tasks, admin = self._stubs()
        stub = tasks if service == "tasks" else admin
        try:
            return await getattr(stub, method)(request, timeout=timeout, metadata=self._call_metadata())
        except grpc.aio.AioRpcError as e:
            raise rpc_error(e) from e

    async def submit(
        self,
        payload: Payload = None,
        *,
        wait: bool = False,
        wait_timeout: float | None = None,
        call_timeout: float | None = None,
        **opts: Unpack[TaskSpecOptions],
    ) -> Submitted:
        """Submit one task (``opts`` are the ``task()`` keywords); with ``wait=True`` also its result."""
        if wait_timeout is not None and not wait:
            raise ValueError("wait_timeout needs wait=True")
        request = pb.SubmitRequest(task=task(payload, **opts), wait=wait)
        if wait_timeout is not None:
            request.wait_timeout_s = to_seconds(wait_timeout, "wait_timeout")
            if call_timeout is None:
                call_timeout = request.wait_timeout_s + 5.0
        if self.coalesce and not wait and call_timeout is None and not trace_metadata():
            response = await self._submit_coalescer().submit(request)
        else:
            response = await self._call("tasks", "Submit", request, call_timeout)
        return Submitted.from_pb(response)

    async def submit_batch(self, tasks: Sequence[pb.TaskSpec]) -> list[Submitted]:
        """Submit several ``task()`` specs atomically; they may depend on each other's keys."""
        response = await self._call("tasks", "SubmitBatch", pb.SubmitBatchRequest(tasks=list(tasks)))
        return [Submitted.from_pb(t, with_result=False) for t in response.tasks]

    async def cancel(self, ref: TaskRef) -> bool:
        """Cancel a task by id or key; False when it had already finished."""
        response = await self._call("tasks", "Cancel", pb.CancelRequest(task=task_ref_to_wire(ref)))
        return bool(response.cancelled)

    async def get(self, ref: TaskRef) -> TaskInfo:
        response = await self._call("tasks", "Get", pb.GetRequest(task=task_ref_to_wire(ref)))
        return TaskInfo.from_pb(response)

    async def list_tasks(
        self, *, pools: Sequence[str] = (), statuses: Sequence[str] = (), after: int = 0, limit: int = 0
    ) -> TaskPage:
        """One page of tasks in id order, after the exclusive id cursor ``after``."""
        refuse_single_string(pools, "pools")
        refuse_single_string(statuses, "statuses")
        request = pb.ListTasksRequest(
            pools=list(pools),
            statuses=[status_to_wire(s) for s in statuses],  # type: ignore[misc]
            after=after,
            limit=limit,
        )
        return TaskPage.from_pb(await self._call("tasks", "ListTasks", request))

    async def iter_tasks(
        self, *, pools: Sequence[str] = (), statuses: Sequence[str] = (), page_size: int = 0
    ) -> AsyncIterator[TaskInfo]:
        """Every matching task, fetching pages as needed."""
        cursor = 0
        while True:
            page = await self.list_tasks(pools=pools, statuses=statuses, after=cursor, limit=page_size)
            for info in page.tasks:
                yield info
            if page.next_after is None:
                return
            cursor = page.next_after

    async def wait(self, ref: TaskRef, timeout: float | None = None) -> Result:
        """Wait for a task to finish; ``TimeoutError`` if it does not within ``timeout`` seconds."""
        request = pb.WaitRequest(task=task_ref_to_wire(ref))
        deadline = None
        if timeout is not None:
            request.timeout_s = to_seconds(timeout, "timeout")
            deadline = request.timeout_s + 5.0
        return Result.from_pb(await self._call("tasks", "Wait", request, deadline))

    async def watch(
        self,
        pools: Iterable[str] | None = None,
        *,
        ids: Iterable[int] | None = None,
        keys: Iterable[str] | None = None,
        all_transitions: bool = False,
    ) -> AsyncIterator[Event]:
        """Stream status events (terminal ones only unless ``all_transitions``), filtered by the args."""
        refuse_single_string(pools, "pools")
        refuse_single_string(keys, "keys")
        request = pb.WatchRequest(
            pools=list(pools or ()), ids=list(ids or ()), keys=list(keys or ()), all_transitions=all_transitions
        )
        tasks, _ = self._stubs()
        call = tasks.Watch(request, metadata=self._call_metadata())
        try:
            while True:
                try:
                    message = await call.read()
                except grpc.aio.AioRpcError as e:
                    if e.code() == grpc.StatusCode.CANCELLED:
                        return
                    raise rpc_error(e) from e
                if message is grpc.aio.EOF:
                    return
                yield Event.from_pb(message)
        finally:
            call.cancel()

    async def snapshot(self) -> Snapshot:
        return Snapshot.from_pb(await self._call("admin", "Snapshot", pb.Empty()))

    async def add_recurring(
        self,
        name: str,
        cron: str,
        payload: Payload | pb.TaskSpec = None,
        *,
        tz: str | None = None,
        overlap: str = "skip",
        **opts: Unpack[TaskSpecOptions],
    ) -> None:
        """Add (or replace) a cron schedule; each occurrence submits the template task."""
        if isinstance(payload, pb.TaskSpec):
            if opts:
                raise TypeError("give task options or a prebuilt TaskSpec, not both")
            template = payload
        else:
            template = task(payload, **opts)
        request = pb.RecurringRequest(
            name=name,
            cron=cron,
            tz=tz or "",
            template=template,
            overlap=from_table(OVERLAPS, overlap, "overlap policy"),
        )
        await self._call("admin", "AddRecurring", request)

    async def remove_recurring(self, name: str) -> bool:
        response = await self._call("admin", "RemoveRecurring", pb.RemoveRecurringRequest(name=name))
        return bool(response.removed)

    async def list_workers(self) -> list[WorkerInfo]:
        response = await self._call("admin", "ListWorkers", pb.Empty())
        return [WorkerInfo.from_pb(w) for w in response.workers]

    async def list_recurring(self) -> list[RecurringInfo]:
        response = await self._call("admin", "ListRecurring", pb.Empty())
        return [RecurringInfo.from_pb(r) for r in response.schedules]
