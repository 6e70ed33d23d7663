"""The commands that make one call (or a short series of calls) and print the answer.

Each command takes the parsed arguments, an open ``Connection`` and the ``Out`` to write to, and
returns the exit code; failed calls are raised as ``CliError`` by ``call``.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from cronoq.proto import cronoq_pb2 as pb

from . import render, spec
from .connection import Connection
from .exits import CliError, Exit, from_rpc, rpc_status
from .text import Out

UNAVAILABLE_SHARDS_KEY = "cronoq-unavailable-shards"
# Unary calls that do not wait for a task still end if the server stops answering.
CALL_TIMEOUT_S = 60.0
# A wait's call deadline is the wait itself plus this much, for the answer to travel.
WAIT_MARGIN_S = 10.0
# Without --timeout, ``wait`` asks for this long at a time (the server caps it at max_wait_s).
WAIT_STEP_S = 300.0
# While a watch leaves out shards that could not be asked, how often to check whether they are
# back (doubling, up to the maximum, while the check says so but the stream still leaves them out).
REJOIN_PROBE_S = 5.0
REJOIN_PROBE_MAX_S = 60.0

Command = Callable[[argparse.Namespace, Connection, Out], Exit]


def call(conn: Connection, method: Any, request: Any, what: str, timeout: float = CALL_TIMEOUT_S) -> Any:
    try:
        return method(request, metadata=conn.metadata, timeout=timeout)
    except grpc.RpcError as e:
        raise from_rpc(e, what) from None


def call_with_shards(
    conn: Connection, method: Any, request: Any, what: str, timeout: float = CALL_TIMEOUT_S
) -> tuple[Any, list[str]]:
    """A unary call and the shards the server could not ask (from the response metadata)."""
    try:
        response, rpc = method.with_call(request, metadata=conn.metadata, timeout=timeout)
    except grpc.RpcError as e:
        raise from_rpc(e, what) from None
    return response, _unavailable_shards(rpc)


def _unavailable_shards(rpc: Any) -> list[str]:
    names: list[str] = []
    for getter in ("initial_metadata", "trailing_metadata"):
        for key, value in getattr(rpc, getter)() or ():
            if key.lower() == UNAVAILABLE_SHARDS_KEY and isinstance(value, str):
                names += [name.strip() for name in value.split(",") if name.strip()]
    return sorted(set(names))


def warn_shards(out: Out, shards: Sequence[str], what: str = "the answer may be incomplete") -> None:
    if shards:
        out.warn(f"shards not reachable: {', '.join(out.safe(s) for s in shards)}; {what}")


def _describe(ref: pb.TaskRef) -> str:
    return f"task {ref.id}" if ref.HasField("id") else f"task with key {ref.key!r}"


# ============================================================================= task commands


def submit(args: argparse.Namespace, conn: Connection, out: Out) -> Exit:
    data, content_type = spec.payload(args.value, args.file, args.json)
    task = pb.TaskSpec(payload=data, content_type=args.content_type or content_type)
    task.priority = spec.priority(args.priority)  # type: ignore[assignment]
    for name in ("pool", "kind", "key", "tenant"):
        value = getattr(args, name)
        if value is not None:
            setattr(task, name, value)
    if args.deadline_in is not None:
        task.deadline_in_s = spec.seconds(args.deadline_in, "--deadline-in")
    if args.start_in is not None:
        task.start_in_s = spec.seconds(args.start_in, "--start-in")
    if args.timeout is not None:
        task.timeout_s = spec.seconds(args.timeout, "--timeout")
    task.labels.update(spec.pairs(args.label, "--label"))
    task.tags.update(spec.pairs(args.tag, "--tag"))
    for ref in args.after or ():
        task.deps.append(pb.Dep(target=spec.dep_ref(ref), cond=pb.EDGE_COND_ON_SUCCESS))
    request = pb.SubmitRequest(task=task, wait=args.wait)
    timeout = CALL_TIMEOUT_S
    if args.wait_timeout is not None:
        if not args.wait:
            raise spec.usage("--wait-timeout needs --wait")
        request.wait_timeout_s = spec.seconds(args.wait_timeout, "--wait-timeout")
        timeout = request.wait_timeout_s + WAIT_MARGIN_S
    elif args.wait:
        timeout = WAIT_STEP_S + WAIT_MARGIN_S
    response = call(conn, conn.tasks.Submit, request, "submit", timeout)
    if args.output == "json":
        out.json(render.submit_json(response))
        return _result_exit(response.result, out, quiet=True) if response.HasField("result") else Exit.OK
    if response.duplicate:
        out.note(f"key already used: task {response.id} exists, nothing new was submitted")
    if not args.wait:
        out.line(str(response.id))
        return Exit.OK
    return _show_result(response.result, out)


def _result_exit(result: pb.TaskResult, out: Out, *, quiet: bool = False) -> Exit:
    if result.status == pb.TASK_STATUS_SUCCEEDED:
        return Exit.OK
    if not quiet:
        reason = f": {result.message}" if result.message else ""
        out.note(f"task {result.id} ended {render.status_name(result.status)}{reason}")
    return Exit.TASK_FAILED


def _show_result(result: pb.TaskResult, out: Out) -> Exit:
    """Print a finished task's output; a task that did not succeed goes to stderr with exit 4."""
    code = _result_exit(result, out)
    if code != Exit.OK:
        return code
    if result.HasField("output"):
        out.payload(result.output)
    elif not result.output_available:
        out.note(f"task {result.id} succeeded; its output is no longer kept by the server")
    return Exit.OK


def get(args: argparse.Namespace, conn: Connection, out: Out) -> Exit:
    ref = spec.task_ref(args.id, args.key)
    info, shards = call_with_shards(conn, conn.tasks.Get, pb.GetRequest(task=ref), f"get {_describe(ref)}")
    if args.output == "json":
        out.json(render.task_info_json(info, shards))
        return Exit.OK
    warn_shards(out, shards, "a task there would not have been found")
    for line in render.task_details(info, out.safe):
        out.line(line)
    return Exit.OK


def wait(args: argparse.Namespace, conn: Connection, out: Out) -> Exit:
    ref = spec.task_ref(args.id, args.key)
    limit = spec.seconds(args.timeout, "--timeout") if args.timeout is not None else None
    deadline = None if limit is None else time.monotonic() + limit
    what = f"wait for {_describe(ref)}"
    while True:
        step = WAIT_STEP_S if deadline is None else max(0.0, min(WAIT_STEP_S, deadline - time.monotonic()))
        request = pb.WaitRequest(task=ref, timeout_s=step)
        try:
            result, rpc = conn.tasks.Wait.with_call(request, metadata=conn.metadata, timeout=step + WAIT_MARGIN_S)
        except grpc.RpcError as e:
            code, _ = rpc_status(e)
            # The server caps each wait at its max_wait_s: ask again until our own limit is reached.
            if code == grpc.StatusCode.DEADLINE_EXCEEDED and (deadline is None or time.monotonic() < deadline):
                continue
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise CliError(Exit.TIMEOUT, f"{_describe(ref)} is still running after {args.timeout}") from None
            raise from_rpc(e, what) from None
        shards = _unavailable_shards(rpc)
        if args.output == "json":
            out.json(render.result_json(result, shards))
            return _result_exit(result, out, quiet=True)
        warn_shards(out, shards, "a task there would not have been found")
        return _show_result(result, out)


def cancel(args: argparse.Namespace, conn: Connection, out: Out) -> Exit:
    ref = spec.task_ref(args.id, args.key)
    response = call(conn, conn.tasks.Cancel, pb.CancelRequest(task=ref), f"cancel {_describe(ref)}")
    if args.output == "json":
        out.json({"cancelled": response.cancelled})
    elif response.cancelled:
        out.line(f"cancelled {out.safe(_describe(ref))}")
    else:
        out.line(f"{out.safe(_describe(ref))} had already finished; nothing to cancel")
    return Exit.OK


def tasks(args: argparse.Namespace, conn: Connection, out: Out) -> Exit:
    try:
        statuses = [render.status_number(name) for name in args.status or ()]
    except ValueError as e:
        raise spec.usage(f"--status: {e}") from None
    if args.limit is not None and args.limit < 1:
        raise spec.usage("--limit must be at least 1")
    after = spec.task_id(args.after, "--after") if args.after is not None else 0
    request = pb.ListTasksRequest(pools=pool_names(args.pool), after=after, limit=args.limit or 0)
    request.statuses.extend(statuses)
    page = call(conn, conn.tasks.ListTasks, request, "list tasks")
    if args.all:
        merged = pb.ListTasksResponse()
        merged.tasks.extend(page.tasks)
        shards = set(page.unavailable_shards)
        while page.next_after:
            request.after = page.next_after
            page = call(conn, conn.tasks.ListTasks, request, "list tasks")
            merged.tasks.extend(page.tasks)
            shards.update(page.unavailable_shards)
        merged.unavailable_shards.extend(sorted(shards))
        page = merged
    if args.output == "json":
        out.json(render.list_json(page))
        return Exit.OK
    warn_shards(out, page.unavailable_shards)
    for line in render.task_rows(page.tasks, out.safe):
        out.line(line)
    if page.next_after:
        out.note(f"more tasks follow: --after {page.next_after} for the next page, or --all for every page")
    return Exit.OK


def pool_names(values: Sequence[str] | None) -> list[str]:
    """``--pool a --pool b`` and ``--pool a,b`` both name two pools."""
    names = [name.strip() for value in values or () for name in value.split(",")]
    if any(not name for name in names):
        raise spec.usage("--pool names must not be empty")
    return names


# ============================================================================ admin commands


def workers(args: argparse.Namespace, conn: Connection, out: Out) -> Exit:
    response = call(conn, conn.admin.ListWorkers, pb.Empty(), "list workers")
    if args.output == "json":
        out.json(render.workers_json(response))
        return Exit.OK
    warn_shards(out, response.unavailable_shards)
    for line in render.worker_rows(response, out.safe):
        out.line(line)
    return Exit.OK


def schedules(args: argparse.Namespace, conn: Connection, out: Out) -> Exit:
    response = call(conn, conn.admin.ListRecurring, pb.Empty(), "list schedules")
    if args.output == "json":
        out.json(render.recurring_json(response))
        return Exit.OK
    warn_shards(out, response.unavailable_shards)
    for line in render.schedule_rows(response, out.safe):
        out.line(line)
    return Exit.OK


def schedule_add(args: argparse.Namespace, conn: Connection, out: Out) -> Exit:
    data, content_type = spec.payload(args.payload, None, args.json)
    template = pb.TaskSpec(payload=data, content_type=content_type)
    template.priority = spec.priority(args.priority)  # type: ignore[assignment]
    for name in ("pool", "kind", "key"):
        value = getattr(args, name)
        if value is not None:
            setattr(template, name, value)
    request = pb.RecurringRequest(
        name=args.name,
        cron=args.cron,
        tz=args.tz or "",
        template=template,
        overlap=spec.OVERLAPS[args.overlap],
    )
    call(conn, conn.admin.AddRecurring, request, f"add schedule {args.name!r}")
    if args.output == "json":
        out.json({"name": args.name, "added": True})
    else:
        out.line(f"schedule {out.safe(args.name)} added")
    return Exit.OK


def schedule_remove(args: argparse.Namespace, conn: Connection, out: Out) -> Exit:
    request = pb.RemoveRecurringRequest(name=args.name)
    response = call(conn, conn.admin.RemoveRecurring, request, f"remove schedule {args.name!r}")
    if args.output == "json":
        out.json({"removed": response.removed})
    elif response.removed:
        out.line(f"schedule {out.safe(args.name)} removed")
    if not response.removed:
        raise CliError(Exit.NOT_FOUND, f"no schedule named {args.name!r}")
    return Exit.OK


def snapshot(args: argparse.Namespace, conn: Connection, out: Out) -> Exit:
    response = call(conn, conn.admin.Snapshot, pb.Empty(), "snapshot")
    if args.output == "json":
        out.json(render.snapshot_json(response))
        return Exit.OK
    warn_shards(out, response.unavailable_shards, "their pools are missing below")
    for line in render.snapshot_lines(response, out.safe):
        out.line(line)
    return Exit.OK


# ===================================================================================== watch


def stream_left_out(stream: Any) -> list[str]:
    """The shards a Watch stream does not carry: the server names them in its initial metadata.
    Waits for that metadata (our servers send it as soon as the subscription is in place)."""
    names: set[str] = set()
    for key, value in stream.initial_metadata() or ():
        if key.lower() == UNAVAILABLE_SHARDS_KEY and isinstance(value, str):
            names.update(name.strip() for name in value.split(",") if name.strip())
    return sorted(names)


class ShardsBack:
    """Cancels a Watch stream that leaves out shards as soon as one of them answers again, so the
    stream can be opened again with it: every ``every`` seconds a one-task listing (same role as
    Watch) names the shards it could not ask."""

    def __init__(
        self, conn: Connection, pools: Sequence[str], stream: Any, missing: Sequence[str], every: float
    ) -> None:
        self.conn = conn
        self.request = pb.ListTasksRequest(pools=pools, limit=1)
        self.stream = stream
        self.missing = set(missing)
        self.every = every
        self.fired = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cronoq-watch-rejoin", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                page = self.conn.tasks.ListTasks(self.request, metadata=self.conn.metadata, timeout=CALL_TIMEOUT_S)
            except grpc.RpcError:
                continue  # the stream itself reports a server that went away
            if self.missing - set(page.unavailable_shards):
                self.fired = True
                self.stream.cancel()
                return

    def stop(self) -> None:
        self._stop.set()


def watch(args: argparse.Namespace, conn: Connection, out: Out) -> Exit:
    """Print events until Ctrl-C. After dropped events (a slow reader) the stream is opened again;
    so it is when a shard fails under an open stream (the rest keep coming, the missing shard is
    named on standard error) and when a shard the stream left out answers again."""
    request = pb.WatchRequest(pools=pool_names(args.pool), all_transitions=args.all)
    left_out: list[str] = []
    probe_every = REJOIN_PROBE_S
    while True:
        stream = conn.tasks.Watch(request, metadata=conn.metadata)
        probe: ShardsBack | None = None
        established = False
        try:
            missing = stream_left_out(stream)
            established = not stream.done()
            if established and missing != left_out:
                if missing:
                    shown = ", ".join(out.safe(name) for name in missing)
                    out.warn(f"shards not reachable: {shown}; their events are not shown until they answer again")
                if back := [name for name in left_out if name not in missing]:
                    out.note(f"shards back: {', '.join(out.safe(name) for name in back)}; their events follow")
                probe_every = REJOIN_PROBE_S
            elif established and missing:
                probe_every = min(probe_every * 2, REJOIN_PROBE_MAX_S)  # the listing saw them, Watch did not
            if established:
                left_out = missing
            if established and missing:
                probe = ShardsBack(conn, request.pools, stream, missing, probe_every)
            for event in stream:
                if args.output == "json":
                    out.json(render.event_json(event))
                else:
                    out.line(render.event_line(event, out.safe))
        except grpc.RpcError as e:
            code, details = rpc_status(e)
            if probe is not None and probe.fired:
                continue  # cancelled to take in a shard that answers again
            if code == grpc.StatusCode.DATA_LOSS:
                out.warn(f"events were dropped ({details}); watching again")
                continue
            if code == grpc.StatusCode.UNAVAILABLE and established:
                # One shard behind a working stream failed; a server that is gone fails the next open.
                out.warn(f"the event stream broke ({details}); watching again")
                time.sleep(0.5)  # no busy loop against a node that keeps breaking streams
                continue
            raise from_rpc(e, "watch") from None
        except KeyboardInterrupt:
            stream.cancel()
            return Exit.OK
        finally:
            if probe is not None:
                probe.stop()
        raise CliError(Exit.UNAVAILABLE, "watch: the server ended the stream")


COMMANDS: dict[str, Command] = {
    "submit": submit,
    "get": get,
    "wait": wait,
    "cancel": cancel,
    "tasks": tasks,
    "workers": workers,
    "schedules": schedules,
    "schedule add": schedule_add,
    "schedule remove": schedule_remove,
    "snapshot": snapshot,
    "watch": watch,
}
