"""A tiny cronoq server for client tests: real grpc.aio services on a loopback port, minimal logic.

It implements just enough of the protocol to exercise ``cronoq.client``: tasks are queued per pool
and leased to registered workers of that pool, worker reports settle the task, ``Wait``/``Submit(wait)``
block until then, ``Watch`` streams settle events. Tests steer it through attributes (what
``Registered`` says, errors to inject, an ``on_register`` hook) and read back what it received.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio

from cronoq.proto import cronoq_pb2 as pb
from cronoq.proto import cronoq_pb2_grpc

pb_grpc: Any = cronoq_pb2_grpc

TERMINAL = {
    pb.TASK_STATUS_SUCCEEDED,
    pb.TASK_STATUS_FAILED,
    pb.TASK_STATUS_DEAD_LETTERED,
    pb.TASK_STATUS_CANCELLED,
    pb.TASK_STATUS_SKIPPED,
    pb.TASK_STATUS_MISSED,
    pb.TASK_STATUS_SHED,
}


@dataclass
class TaskRec:
    id: int
    spec: pb.TaskSpec
    status: int = pb.TASK_STATUS_READY
    attempt: int = 0
    output: bytes | None = None
    message: str = ""
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def result(self) -> pb.TaskResult:
        r = pb.TaskResult(id=self.id, status=self.status, message=self.message)  # type: ignore[arg-type]
        if self.output is not None:
            r.output = self.output
            r.output_available = True
        return r


@dataclass
class WorkStream:
    """One Work stream as the server saw it."""

    metadata: dict[str, Any]
    register: pb.Register | None = None
    received: list[pb.WorkerMessage] = field(default_factory=list)
    batches: list[pb.WorkerBatch] = field(default_factory=list)
    outbox: asyncio.Queue[pb.ServerMessage | None] = field(default_factory=asyncio.Queue)
    half_closed: asyncio.Event = field(default_factory=asyncio.Event)
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    def kinds(self) -> list[str]:
        return [str(m.WhichOneof("msg")) for m in self.received]

    def of_kind(self, kind: str) -> list[Any]:
        return [getattr(m, kind) for m in self.received if m.WhichOneof("msg") == kind]

    def send(self, **arm: Any) -> None:
        self.outbox.put_nowait(pb.ServerMessage(**arm))


OnRegister = Callable[[WorkStream, Any], Awaitable[None]]


class FakeCronoq:
    """Servicer for Tasks, Workers and Admin at once."""

    def __init__(self) -> None:
        self.address = ""
        # What Registered says.
        self.lease_ttl_s: float | None = None
        self.granted_slots = 0
        self.protocol_version = 3
        self.max_message_bytes = 0
        self.batching = False
        """Take up a worker's ``batch_bytes`` (``Registered.batching``), as a cronoq server does."""
        # Lease knobs.
        self.lease_ttl_per_lease: float | None = None
        self.auto_dispatch = True
        self.on_register: OnRegister | None = None
        # Tasks.
        self.tasks: dict[int, TaskRec] = {}
        self.by_key: dict[str, int] = {}
        self.queues: dict[str, asyncio.Queue[int]] = {}
        self.leases: dict[int, int] = {}
        self.next_id = 1
        self.next_lease = 1000
        # Observations and injections.
        self.streams: list[WorkStream] = []
        self.calls: list[tuple[str, dict[str, Any], Any]] = []
        self.deadlines: dict[str, float | None] = {}
        self.fail_next: dict[str, tuple[grpc.StatusCode, str]] = {}
        self.watchers: list[asyncio.Queue[Any]] = []
        self.watch_requests: list[pb.WatchRequest] = []
        self.recurring: dict[str, pb.RecurringRequest] = {}

    # ---------------------------------------------------------------- plumbing

    async def _enter(self, method: str, request: Any, context: Any) -> None:
        self.calls.append((method, dict(context.invocation_metadata() or ()), request))
        self.deadlines[method] = context.time_remaining()
        injected = self.fail_next.pop(method, None)
        if injected is not None:
            await context.abort(*injected)

    def queue(self, pool: str) -> asyncio.Queue[int]:
        return self.queues.setdefault(pool, asyncio.Queue())

    def _admit(self, spec: pb.TaskSpec) -> pb.SubmitResponse:
        if spec.key and spec.key in self.by_key:
            return pb.SubmitResponse(id=self.by_key[spec.key], duplicate=True)
        rec = TaskRec(self.next_id, spec)
        self.next_id += 1
        self.tasks[rec.id] = rec
        if spec.key:
            self.by_key[spec.key] = rec.id
        self.queue(spec.pool or "default").put_nowait(rec.id)
        return pb.SubmitResponse(id=rec.id)

    def settle(self, task_id: int, status: int, output: bytes | None = None, message: str = "") -> None:
        rec = self.tasks[task_id]
        rec.status, rec.output, rec.message = status, output, message
        rec.done.set()
        event = pb.StatusEvent(
            id=rec.id,
            pool=rec.spec.pool or "default",
            key=rec.spec.key,
            status=status,  # type: ignore[arg-type]
            attempt=rec.attempt,
            at_unix_ns=1_000_000_000 * rec.id,
            message=message,
        )
        for q in self.watchers:
            q.put_nowait(event)

    def _lookup(self, ref: pb.TaskRef) -> TaskRec | None:
        if ref.WhichOneof("target") == "key":
            tid = self.by_key.get(ref.key)
            return self.tasks.get(tid) if tid is not None else None
        return self.tasks.get(ref.id)

    # ---------------------------------------------------------------- Tasks

    async def Submit(self, request: pb.SubmitRequest, context: Any) -> pb.SubmitResponse:
        await self._enter("Submit", request, context)
        response = self._admit(request.task)
        if request.wait:
            rec = self.tasks[response.id]
            timeout = request.wait_timeout_s if request.HasField("wait_timeout_s") else None
            try:
                await asyncio.wait_for(rec.done.wait(), timeout)
            except TimeoutError:
                await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "task still running")
            response.result.CopyFrom(rec.result())
        return response

    async def SubmitBatch(self, request: pb.SubmitBatchRequest, context: Any) -> pb.SubmitBatchResponse:
        await self._enter("SubmitBatch", request, context)
        return pb.SubmitBatchResponse(tasks=[self._admit(spec) for spec in request.tasks])

    async def Cancel(self, request: pb.CancelRequest, context: Any) -> pb.CancelResponse:
        await self._enter("Cancel", request, context)
        rec = self._lookup(request.task)
        if rec is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "unknown task")
        assert rec is not None
        if rec.status in TERMINAL:
            return pb.CancelResponse(cancelled=False)
        self.settle(rec.id, pb.TASK_STATUS_CANCELLED)
        return pb.CancelResponse(cancelled=True)

    async def Get(self, request: pb.GetRequest, context: Any) -> pb.TaskInfo:
        await self._enter("Get", request, context)
        rec = self._lookup(request.task)
        if rec is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "unknown task")
        assert rec is not None
        return pb.TaskInfo(
            id=rec.id,
            status=rec.status,
            pool=rec.spec.pool or "default",
            key=rec.spec.key,  # type: ignore[arg-type]
            kind=rec.spec.kind,
            attempt=rec.attempt,
            max_attempts=3,
            created_unix_ns=rec.id * 10**9,
            priority=rec.spec.priority,
            tenant=rec.spec.tenant,
        )

    async def ListTasks(self, request: pb.ListTasksRequest, context: Any) -> pb.ListTasksResponse:
        await self._enter("ListTasks", request, context)
        limit = request.limit or 100
        chosen = [
            rec
            for tid, rec in sorted(self.tasks.items())
            if tid > request.after
            and (not request.pools or (rec.spec.pool or "default") in request.pools)
            and (not request.statuses or rec.status in request.statuses)
        ]
        page = chosen[:limit]
        response = pb.ListTasksResponse(unavailable_shards=["shard-9"])
        for rec in page:
            response.tasks.append(pb.TaskInfo(id=rec.id, status=rec.status))  # type: ignore[arg-type]
        if len(chosen) > limit:
            response.next_after = page[-1].id
        return response

    async def Wait(self, request: pb.WaitRequest, context: Any) -> pb.TaskResult:
        await self._enter("Wait", request, context)
        rec = self._lookup(request.task)
        if rec is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "unknown task")
        assert rec is not None
        timeout = request.timeout_s if request.HasField("timeout_s") else None
        try:
            await asyncio.wait_for(rec.done.wait(), timeout)
        except TimeoutError:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "task still running")
        return rec.result()

    async def Watch(self, request: pb.WatchRequest, context: Any) -> AsyncIterator[pb.StatusEvent]:
        await self._enter("Watch", request, context)
        self.watch_requests.append(request)
        q: asyncio.Queue[Any] = asyncio.Queue()
        self.watchers.append(q)
        try:
            while True:
                item = await q.get()
                if item is None:
                    return
                if isinstance(item, tuple):
                    await context.abort(*item)
                if request.ids and item.id not in request.ids:
                    continue
                yield item
        finally:
            self.watchers.remove(q)

    def end_watches(self, item: Any = None) -> None:
        """End every open Watch: normally (None) or with a ``(code, details)`` status."""
        for q in self.watchers:
            q.put_nowait(item)

    # ---------------------------------------------------------------- Workers

    async def Work(self, request_iterator: Any, context: Any) -> None:
        stream = WorkStream(metadata=dict(context.invocation_metadata() or ()))
        self.streams.append(stream)
        try:
            first = await context.read()
            if first is grpc.aio.EOF:
                return
            assert first.WhichOneof("msg") == "register", first
            stream.register = first.register
            if self.on_register is not None:
                await self.on_register(stream, context)
            registered = pb.Registered(
                worker_id=len(self.streams),
                slots=self.granted_slots,
                protocol_version=self.protocol_version,
                max_message_bytes=self.max_message_bytes,
                batching=self.batching and stream.register.batch_bytes > 0,
            )
            if self.lease_ttl_s is not None:
                registered.lease_ttl_s = self.lease_ttl_s
            await context.write(pb.ServerMessage(registered=registered))
            await self._serve_stream(stream, context)
        finally:
            stream.ended.set()

    async def _serve_stream(self, stream: WorkStream, context: Any) -> None:
        reader = asyncio.create_task(self._read_worker(stream, context))
        dispatcher = asyncio.create_task(self._dispatch(stream)) if self.auto_dispatch else None
        try:
            while True:
                next_out = asyncio.create_task(stream.outbox.get())
                done, _ = await asyncio.wait({next_out, reader}, return_when=asyncio.FIRST_COMPLETED)
                if next_out not in done:
                    next_out.cancel()
                    return  # the worker half-closed: end the stream with OK
                message = next_out.result()
                if message is None:
                    return
                await context.write(message)
        finally:
            for t in (reader, dispatcher):
                if t is not None:
                    t.cancel()
                    with contextlib.suppress(BaseException):
                        await t

    async def _read_worker(self, stream: WorkStream, context: Any) -> None:
        while True:
            message = await context.read()
            if message is grpc.aio.EOF:
                stream.half_closed.set()
                return
            stream.received.append(message)
            if message.WhichOneof("msg") == "batch":
                stream.batches.append(message.batch)
                for done in message.batch.completes:
                    self._report(pb.WorkerMessage(complete=done))
                for fail in message.batch.fails:
                    self._report(pb.WorkerMessage(fail=fail))
                for cancelled in message.batch.cancelled:
                    self._report(pb.WorkerMessage(cancelled=cancelled))
            else:
                self._report(message)

    def _report(self, message: pb.WorkerMessage) -> None:
        kind = message.WhichOneof("msg")
        if kind == "complete":
            tid = self.leases.get(message.complete.lease)
            if tid is not None:
                self.settle(tid, pb.TASK_STATUS_SUCCEEDED, message.complete.output)
        elif kind == "fail" and message.fail.permanent:
            tid = self.leases.get(message.fail.lease)
            if tid is not None:
                self.settle(tid, pb.TASK_STATUS_FAILED, None, message.fail.message)
        elif kind == "cancelled":
            tid = self.leases.get(message.cancelled.lease)
            if tid is not None:
                self.settle(tid, pb.TASK_STATUS_CANCELLED)

    def lease_for(self, task_id: int, pool: str) -> pb.Lease:
        rec = self.tasks[task_id]
        rec.attempt += 1
        rec.status = pb.TASK_STATUS_RUNNING
        lease_id = self.next_lease
        self.next_lease += 1
        self.leases[lease_id] = task_id
        lease = pb.Lease(
            lease=lease_id,
            task_id=task_id,
            attempt=rec.attempt,
            payload=rec.spec.payload,
            content_type=rec.spec.content_type,
            kind=rec.spec.kind,
            key=rec.spec.key,
            tags=dict(rec.spec.tags),
            pool=pool,
            priority=rec.spec.priority,
        )
        if self.lease_ttl_per_lease is not None:
            lease.lease_ttl_s = self.lease_ttl_per_lease
        if rec.spec.HasField("timeout_s"):
            lease.timeout_s = rec.spec.timeout_s
        return lease

    async def _dispatch(self, stream: WorkStream) -> None:
        assert stream.register is not None
        pool = stream.register.pool
        q = self.queue(pool)
        while True:
            task_id = await q.get()
            stream.send(lease=self.lease_for(task_id, pool))

    # ---------------------------------------------------------------- Admin

    async def Snapshot(self, request: pb.Empty, context: Any) -> pb.SnapshotResponse:
        await self._enter("Snapshot", request, context)
        pool = pb.PoolSnapshot(name="default", capacity=2, busy=1, pending_by_class=[0, 1, 2, 0], wait_p50_s=0.5)
        return pb.SnapshotResponse(
            pools=[pool],
            live_tasks=len(self.tasks),
            running=1,
            pending=3,
            totals=pb.Totals(submitted=len(self.tasks)),
            workers_connected=1,
        )

    async def AddRecurring(self, request: pb.RecurringRequest, context: Any) -> pb.Empty:
        await self._enter("AddRecurring", request, context)
        self.recurring[request.name] = request
        return pb.Empty()

    async def RemoveRecurring(self, request: pb.RemoveRecurringRequest, context: Any) -> pb.RemoveRecurringResponse:
        await self._enter("RemoveRecurring", request, context)
        return pb.RemoveRecurringResponse(removed=self.recurring.pop(request.name, None) is not None)

    async def ListWorkers(self, request: pb.Empty, context: Any) -> pb.ListWorkersResponse:
        await self._enter("ListWorkers", request, context)
        response = pb.ListWorkersResponse()
        for index, s in enumerate(self.streams, start=1):
            if s.register is not None and not s.ended.is_set():
                response.workers.append(
                    pb.WorkerInfo(
                        id=index,
                        name=s.register.worker_name,
                        pool=s.register.pool,
                        labels=dict(s.register.labels),
                        slots=s.register.slots,
                        connected_unix_ns=5 * 10**9,
                    )
                )
        return response

    async def ListRecurring(self, request: pb.Empty, context: Any) -> pb.ListRecurringResponse:
        await self._enter("ListRecurring", request, context)
        response = pb.ListRecurringResponse()
        for r in self.recurring.values():
            response.schedules.append(
                pb.RecurringInfo(
                    name=r.name, cron=r.cron, tz=r.tz, pool=r.template.pool, kind=r.template.kind, overlap=r.overlap
                )
            )
        return response


async def start_server(servicer: FakeCronoq) -> Any:
    server = grpc.aio.server()
    pb_grpc.add_TasksServicer_to_server(servicer, server)
    pb_grpc.add_WorkersServicer_to_server(servicer, server)
    pb_grpc.add_AdminServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    servicer.address = f"127.0.0.1:{port}"
    return server


async def eventually(predicate: Callable[[], bool], timeout: float = 5.0, what: str = "condition") -> None:
    """Poll ``predicate`` until it holds; fail the test after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not predicate():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)
