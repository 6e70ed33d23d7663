"""The router in every node: which shard(s) a call concerns, and how to reach them.

``Router`` has the same calls as the server's transport-independent API (``cronoq.server.api.Api``:
``(principal, request message) -> response message``) and sits in front of it. A call that concerns
only this node's shard goes to the local API unchanged; work for another shard is forwarded to that
shard's endpoint as the same ``cronoq.v1`` request, carrying the caller's own ``authorization`` and
marked forwarded so the receiving node answers it itself and never forwards it again. The calls on
peers are made by ``calls.PeerCalls``: unary calls travel over one Forward stream per peer
(``forward``), watches as their own gRPC calls; a forwarded call not answered in time is
DEADLINE_EXCEEDED, one whose peer could not be reached UNAVAILABLE.

- Submissions, batches and new schedules go to the shard of their pool (a batch must stay in one).
  Concurrent Submits for one shard with the same credentials may travel together as one SubmitBatch
  (``coalesce``); each caller still gets the answer of its own Submit.
- Lookups, waits and cancellations by id go to the shard in the id's top 8 bits.
- By key, every shard is asked: a key found in two shards is refused (FAILED_PRECONDITION), Get and
  Wait still answer while a shard is missing (naming it), Cancel by key is refused (UNAVAILABLE).
- Listings, snapshots and watches cover every shard and name the ones that could not be asked.
- Some calls are not forwarded but refused with FAILED_PRECONDITION and the shard's endpoint in
  ``cronoq-shard`` / ``cronoq-shard-endpoint``: callers authenticated by a client certificate (there
  is no token to forward) and shards behind plain ``http://`` on another host.

Credentials are checked (role, pool scope) before anything about shards is revealed: a call that
names no pool is first given the default pool (the local API's rule, written into the request so
the receiving shard acts on the same pool), and a pool-scoped caller's reads and lookups skip the
shards that serve none of its pools. Errors are ``RouteError`` or whatever the local API raises;
the server maps both.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextvars import ContextVar
from functools import partial
from typing import Any, Protocol, TypeVar

import grpc
from cronoq.cluster.peers import Peer, PeerChannels
from cronoq.cluster.topology import MOVED_KEY, SHARD_KEY, Placement, Topology, stale_placement
from cronoq.config import Config, Role, ShardSection

from cronoq.proto import console_pb2 as cpb
from cronoq.proto import console_pb2_grpc as cpbg
from cronoq.proto import cronoq_pb2 as pb

from . import merge
from .calls import MISSING, PEER_READ_TIMEOUT_S, Caller, PeerCalls, remote_events, status_of
from .errors import RouteError
from .forward import FORWARDED

__all__ = ["FORWARDED", "UNAVAILABLE_SHARDS_KEY", "Caller", "LocalApi", "Router", "collect_unavailable"]

UNAVAILABLE_SHARDS_KEY = "cronoq-unavailable-shards"
"""Response metadata naming shards a by-key lookup could not ask (comma-separated)."""

SHARD_BITS = 56
"""Task ids carry their shard's number above this bit."""
REPLICA_TIMEOUT_S = 2.0
"""Longest the leader waits for one of its replicas to describe itself (then: unavailable)."""

_unavailable: ContextVar[list[str] | None] = ContextVar("cronoq_unavailable_shards", default=None)

Status = grpc.StatusCode


@contextlib.contextmanager
def collect_unavailable() -> Any:
    """Within the block, shards a call could not ask are appended to the yielded list (for
    responses that carry them outside the message: gRPC metadata, HTTP task-detail fields)."""
    names: list[str] = []
    token = _unavailable.set(names)
    try:
        yield names
    finally:
        _unavailable.reset(token)


def _note_unavailable(names: Iterable[str]) -> None:
    sink = _unavailable.get()
    if sink is not None:
        sink.extend(name for name in names if name not in sink)


_Answers = list[tuple[ShardSection, Any]]
_R = TypeVar("_R")
"""Per shard that answered: the shard and its answer."""


class LocalApi(Protocol):
    """This node's shard: the server's API object."""

    default_pool: str

    def submit(self, principal: Any, request: pb.SubmitRequest) -> Awaitable[pb.SubmitResponse]: ...
    def submit_batch(self, principal: Any, request: pb.SubmitBatchRequest) -> Awaitable[pb.SubmitBatchResponse]: ...
    def get(self, principal: Any, request: pb.GetRequest) -> Awaitable[pb.TaskInfo]: ...
    def list_tasks(self, principal: Any, request: pb.ListTasksRequest) -> Awaitable[pb.ListTasksResponse]: ...
    def search_tasks(self, principal: Any, request: cpb.SearchTasksRequest) -> Awaitable[pb.ListTasksResponse]: ...
    def task_detail(self, principal: Any, request: pb.GetRequest) -> Awaitable[cpb.TaskDetail]: ...
    def wait(self, principal: Any, request: pb.WaitRequest) -> Awaitable[pb.TaskResult]: ...
    def cancel(self, principal: Any, request: pb.CancelRequest) -> Awaitable[pb.CancelResponse]: ...
    def watch(self, principal: Any, request: pb.WatchRequest) -> Awaitable[AsyncIterator[pb.StatusEvent]]: ...
    def snapshot(self, principal: Any, request: pb.Empty | None = None) -> Awaitable[pb.SnapshotResponse]: ...
    def metrics_text(self, principal: Any) -> Awaitable[tuple[bytes, str]]: ...
    def add_recurring(self, principal: Any, request: pb.RecurringRequest) -> Awaitable[pb.Empty]: ...
    def remove_recurring(self, principal: Any, request: pb.RemoveRecurringRequest
                         ) -> Awaitable[pb.RemoveRecurringResponse]: ...  # fmt: skip
    def list_workers(self, principal: Any, request: pb.Empty | None = None) -> Awaitable[pb.ListWorkersResponse]: ...
    def list_recurring(self, principal: Any, request: pb.Empty | None = None
                       ) -> Awaitable[pb.ListRecurringResponse]: ...  # fmt: skip
    def list_shards(self, principal: Any, request: pb.Empty) -> Awaitable[cpb.ListShardsResponse]: ...
    def list_schedules(self, principal: Any, request: pb.Empty) -> Awaitable[cpb.ListSchedulesResponse]: ...
    def move_pool(self, principal: Any, request: cpb.MovePoolRequest) -> Awaitable[cpb.MoveStatus]: ...
    def get_move(self, principal: Any, request: cpb.MoveRequest) -> Awaitable[cpb.MoveStatus]: ...
    def abort_move(self, principal: Any, request: cpb.MoveRequest) -> Awaitable[cpb.MoveStatus]: ...
    def pause_schedule(self, principal: Any, request: cpb.ScheduleRequest) -> Awaitable[cpb.ScheduleResponse]: ...
    def resume_schedule(self, principal: Any, request: cpb.ScheduleRequest) -> Awaitable[cpb.ScheduleResponse]: ...


class Router:
    """Routes every call of the API between this node's shard and its peers."""

    def __init__(self, config: Config, local: LocalApi, *, traceparent: Callable[[], str | None] | None = None,
                 time_left: Callable[[], float | None] | None = None,
                 topology: Topology | None = None) -> None:  # fmt: skip
        self.config = config
        # Where each pool is, at which version: learned forward from shards that refuse a call
        # routed on an older placement (docs/pool-moves.md).
        self.topology = topology if topology is not None else Topology.from_config(config)
        self.local = local
        self.limits = config.limits
        self.sharded = config.sharded and config.local_shard() is not None
        local_shard = config.local_shard()
        self.local_name = local_shard.name if local_shard is not None else ""
        self.peers = PeerChannels(config)
        # Every call on a peer, within what is left of the caller's deadline (``time_left``): a
        # forwarded call carries no more than that, so its shard stops when the caller does.
        self.calls = PeerCalls(self.peers, self.limits, traceparent=traceparent, time_left=time_left)
        self._all_pools = frozenset(pool.name for pool in config.pools)
        self._by_number = {shard.number: shard for shard in config.shards}
        self._by_name = {shard.name: shard for shard in config.shards}
        self._ordered = sorted(config.shards, key=lambda shard: shard.number)

    async def close(self) -> None:
        await self.calls.close()
        await self.peers.close()

    # ------------------------------------------------------------------------------ decisions

    def _local_only(self, caller: Caller) -> bool:
        return not self.sharded or caller.forwarded

    def _check_pool(self, caller: Caller, pool: str, where: str = "") -> None:
        """Scope first (a pool the caller may not use reveals nothing), then existence."""
        if not caller.sees(pool):
            raise RouteError(Status.PERMISSION_DENIED, f"{where}this credential may not use pool {pool!r}")
        if pool not in self._all_pools:
            raise RouteError(Status.NOT_FOUND, f"{where}unknown pool {pool!r}")

    def _shard_of_pool(self, pool: str) -> ShardSection:
        placement = self.topology.placement(pool)
        assert placement is not None
        return self.config.shard(placement.shard)

    def _learned(self, exc: Exception) -> bool:
        """Whether ``exc`` is a refusal of a call routed on an old placement that named a newer
        one (now cached): the call is then worth one more try. Calls refused together (a shared
        SubmitBatch, or several at once) all retry, not only the one that taught the cache."""
        if not isinstance(exc, RouteError) or exc.code is not Status.FAILED_PRECONDITION:
            return False
        found = stale_placement(exc.metadata)
        if found is None:
            return False
        pool, placement = found
        return self.topology.learn(pool, placement) or self.topology.placement(pool) == placement

    async def _retrying(self, call: Callable[[], Awaitable[_R]]) -> _R:
        """``call``, and once more if it was refused as routed on an old placement. Refused so
        again, the pool is changing shards right now (the two shards' records have not both
        caught up): UNAVAILABLE, which clients retry, rather than a refusal they would not."""
        try:
            return await call()
        except RouteError as exc:
            if not self._learned(exc):
                raise
        try:
            return await call()
        except Exception as exc:
            # The second try may have been served here (the local API's own error type, with the
            # same code and metadata): a shard the pool is being handed to that has not noticed yet
            # refuses naming the placement it still holds.
            found = _stale_refusal(exc)
            if found is None:
                raise
            raise RouteError(Status.UNAVAILABLE, f"pool {found[0]!r} is changing shards; retry shortly") from None

    def _peer_for(self, caller: Caller, shard: ShardSection, what: str) -> Peer | None:
        """Where a call about ``shard`` goes: None for this node, else the peer to forward to.
        Refuses (FAILED_PRECONDITION + endpoint metadata) what must not be forwarded."""
        if shard.name == self.local_name:
            return None
        if caller.certificate:
            reason = "callers authenticated by a client certificate have no token to forward"
        else:
            peer = self.peers.peer(shard.name)
            if peer.refusal is None:
                return peer
            reason = peer.refusal
        raise RouteError(
            Status.FAILED_PRECONDITION,
            f"{what} is served by shard {shard.name!r} at {shard.endpoint}; call it there ({reason})",
            (("cronoq-shard", shard.name), ("cronoq-shard-endpoint", shard.endpoint)),
        )

    def _resolved_pool(self, caller: Caller, spec: pb.TaskSpec, where: str = "") -> str:
        """The pool ``spec`` goes to, by the local API's one rule, written into ``spec`` so the
        shard it is forwarded to does not default it again; then checked against the scope."""
        if not spec.pool:
            spec.pool = self.local.default_pool
        self._check_pool(caller, spec.pool, where)
        return spec.pool

    def _peer_for_spec(self, caller: Caller, spec: pb.TaskSpec) -> Peer | None:
        """Where a task or template goes (its pool resolved and checked first)."""
        pool = self._resolved_pool(caller, spec)
        return self._peer_for(caller, self._shard_of_pool(pool), f"pool {pool!r}")

    def _pools_of(self, shard: ShardSection) -> tuple[str, ...]:
        return self.topology.pools_of(shard.name)

    def _concerns(self, caller: Caller, shard: ShardSection) -> bool:
        """Whether ``shard`` serves a pool the caller may see. A pool-scoped caller's reads skip
        the other shards: they could only answer "nothing", or name themselves as unavailable."""
        return any(caller.sees(pool) for pool in self._pools_of(shard))

    def _reachable(self, caller: Caller, shard: ShardSection) -> Peer | None:
        """For fan-out reads: the peer to ask, or None when it cannot be asked for this caller."""
        if caller.certificate:
            return None
        peer = self.peers.peer(shard.name)
        return peer if peer.refusal is None else None

    def _wait_timeout(self, requested: float | None) -> float:
        cap = self.limits.max_wait_s
        wait = cap if requested is None or requested != requested else max(0.0, min(requested, cap))
        return wait + self.limits.request_timeout_s

    # ------------------------------------------------------------------------------ Tasks

    async def submit(self, caller: Caller, request: pb.SubmitRequest) -> pb.SubmitResponse:
        if self._local_only(caller):
            return await self.local.submit(caller, request)
        caller.require(Role.CLIENT)
        return await self._retrying(partial(self._submit, caller, request))

    async def _submit(self, caller: Caller, request: pb.SubmitRequest) -> pb.SubmitResponse:
        peer = self._peer_for_spec(caller, request.task)
        if peer is None:
            return await self.local.submit(caller, request)
        timeout = self.limits.request_timeout_s
        if request.wait:
            timeout = self._wait_timeout(request.wait_timeout_s if request.HasField("wait_timeout_s") else None)
        else:
            timeout = self.calls.within_deadline(timeout)
        return await self.calls.submit(peer, request, caller, timeout)

    async def submit_batch(self, caller: Caller, request: pb.SubmitBatchRequest) -> pb.SubmitBatchResponse:
        if self._local_only(caller) or not request.tasks:
            return await self.local.submit_batch(caller, request)
        caller.require(Role.CLIENT)
        if len(request.tasks) > self.limits.max_tasks_per_batch:
            return await self.local.submit_batch(caller, request)  # reports the limit
        return await self._retrying(partial(self._submit_batch, caller, request))

    async def _submit_batch(self, caller: Caller, request: pb.SubmitBatchRequest) -> pb.SubmitBatchResponse:
        shard: ShardSection | None = None
        first = 0
        for index, task in enumerate(request.tasks):
            owner = self._shard_of_pool(self._resolved_pool(caller, task, f"task {index}: "))
            if shard is None:
                shard, first = owner, index
            elif owner.name != shard.name:
                raise RouteError(Status.INVALID_ARGUMENT,
                                 f"a batch must stay in one shard: task {first} is for shard {shard.name!r}, "
                                 f"task {index} for shard {owner.name!r}")  # fmt: skip
        assert shard is not None
        peer = self._peer_for(caller, shard, "this batch")
        if peer is None:
            return await self.local.submit_batch(caller, request)
        response: pb.SubmitBatchResponse = await self.calls.call(
            peer, "tasks", "SubmitBatch", request, caller, self.limits.request_timeout_s
        )
        return response

    def _shard_of_id(self, task_id: int) -> ShardSection | None:
        return self._by_number.get(task_id >> SHARD_BITS)

    async def get(self, caller: Caller, request: pb.GetRequest) -> pb.TaskInfo:
        if self._local_only(caller) or _malformed(request.task):
            return await self.local.get(caller, request)  # the local API explains what is wrong
        caller.require(Role.CLIENT)
        if _by_key(request.task):
            _, found = await self._find_key(caller, request.task.key, cancelling=False)
            return found
        return await self._at_task_shard(
            caller, request.task.id, partial(self.local.get, caller, request),
            lambda peer: self.calls.call(peer, "tasks", "Get", request, caller, self.limits.request_timeout_s),
        )  # fmt: skip

    async def _at_task_shard(self, caller: Caller, task_id: int, local: Callable[[], Awaitable[_R]],
                             remote: Callable[[Peer], Awaitable[_R]]) -> _R:  # fmt: skip
        """A call about task ``task_id``, answered by the shard of its id; once more where that
        shard says the task moved with its pool (``cronoq-task-moved``)."""
        peer = self._peer_by_id(caller, task_id)
        try:
            return await (local() if peer is None else remote(peer))
        except Exception as exc:
            moved = _moved_shard(exc)
            if moved is None or moved not in self._by_name:
                raise
        peer = self._peer_for(caller, self._by_name[moved], f"task {task_id}")
        return await (local() if peer is None else remote(peer))

    def _peer_by_id(self, caller: Caller, task_id: int) -> Peer | None:
        shard = self._shard_of_id(task_id)
        if shard is None or not self._concerns(caller, shard):
            raise RouteError(Status.NOT_FOUND, "task not found")
        return self._peer_for(caller, shard, f"task {task_id}")

    async def wait(self, caller: Caller, request: pb.WaitRequest) -> pb.TaskResult:
        if self._local_only(caller) or _malformed(request.task):
            return await self.local.wait(caller, request)  # the local API explains what is wrong
        caller.require(Role.CLIENT)
        timeout = self._wait_timeout(request.timeout_s if request.HasField("timeout_s") else None)
        if _by_key(request.task):
            shard, info = await self._find_key(caller, request.task.key, cancelling=False)
            request = _with_id(request, info.id)
            peer = None if shard.name == self.local_name else self.peers.peer(shard.name)
        else:
            return await self._at_task_shard(
                caller, request.task.id, partial(self.local.wait, caller, request),
                lambda peer: self.calls.call(peer, "tasks", "Wait", request, caller, timeout),
            )  # fmt: skip
        if peer is None:
            return await self.local.wait(caller, request)
        result: pb.TaskResult = await self.calls.call(peer, "tasks", "Wait", request, caller, timeout)
        return result

    async def cancel(self, caller: Caller, request: pb.CancelRequest) -> pb.CancelResponse:
        if self._local_only(caller) or _malformed(request.task):
            return await self.local.cancel(caller, request)  # the local API explains what is wrong
        caller.require(Role.CLIENT)
        if _by_key(request.task):
            shard, info = await self._find_key(caller, request.task.key, cancelling=True)
            request = pb.CancelRequest(task=pb.TaskRef(id=info.id))
            peer = None if shard.name == self.local_name else self.peers.peer(shard.name)
        else:
            return await self._at_task_shard(
                caller, request.task.id, partial(self.local.cancel, caller, request),
                lambda peer: self.calls.call(peer, "tasks", "Cancel", request, caller, self.limits.request_timeout_s),
            )  # fmt: skip
        if peer is None:
            return await self.local.cancel(caller, request)
        response: pb.CancelResponse = await self.calls.call(peer, "tasks", "Cancel", request, caller,
                                                          self.limits.request_timeout_s)  # fmt: skip
        return response

    async def _find_key(self, caller: Caller, key: str, *, cancelling: bool) -> tuple[ShardSection, pb.TaskInfo]:
        """Ask every shard for the task with ``key``: exactly one may hold it."""
        request = pb.GetRequest(task=pb.TaskRef(key=key))
        answers, missing = await self._fan_out(
            caller,
            lambda: self.local.get(caller, request),
            lambda peer: self.calls.call(peer, "tasks", "Get", request, caller, PEER_READ_TIMEOUT_S),
            absent=Status.NOT_FOUND,
        )
        found = [(shard, info) for shard, info in answers if info is not None]
        if len(found) > 1:
            names = " and ".join(repr(shard.name) for shard, _ in found)
            raise RouteError(Status.FAILED_PRECONDITION,
                             f"key {key!r} names tasks in shards {names}; use the task id")  # fmt: skip
        if cancelling and missing:
            raise RouteError(Status.UNAVAILABLE,
                             f"cannot cancel by key while shards {', '.join(missing)} cannot be asked (another "
                             f"task with this key may be there); cancel by id")  # fmt: skip
        if not found:
            if missing:
                raise RouteError(Status.UNAVAILABLE,
                                 f"task not found in the reachable shards; shards {', '.join(missing)} could not "
                                 f"be asked", ((UNAVAILABLE_SHARDS_KEY, ",".join(missing)),))  # fmt: skip
            raise RouteError(Status.NOT_FOUND, "task not found")
        _note_unavailable(missing)
        return found[0]

    async def _fan_out(self, caller: Caller, local: Callable[[], Awaitable[Any]],
                       remote: Callable[[Peer], Awaitable[Any]], *,
                       absent: grpc.StatusCode | None = None) -> tuple[_Answers, list[str]]:  # fmt: skip
        """Ask every shard (concurrently, in shard-number order). Returns the answers, with None
        for shards that answered ``absent``, and the names of shards that could not be asked."""
        shards: list[ShardSection] = []
        calls: list[Awaitable[Any]] = []
        missing: list[str] = []
        for shard in self._ordered:
            if not self._concerns(caller, shard):
                continue
            if shard.name == self.local_name:
                shards.append(shard)
                calls.append(local())
                continue
            peer = self._reachable(caller, shard)
            if peer is None:
                missing.append(shard.name)
                continue
            shards.append(shard)
            calls.append(remote(peer))
        results = await asyncio.gather(*calls, return_exceptions=True)
        answers: _Answers = []
        for shard, result in zip(shards, results, strict=True):
            if isinstance(result, BaseException):
                status = status_of(result)
                if status is not None and status == absent:
                    answers.append((shard, None))
                    continue
                if status in MISSING:
                    missing.append(shard.name)
                    continue
                raise result
            answers.append((shard, result))
        order = {shard.name: shard.number for shard in self._ordered}
        missing.sort(key=lambda name: order[name])
        return answers, missing

    async def list_tasks(self, caller: Caller, request: pb.ListTasksRequest) -> pb.ListTasksResponse:
        if self._local_only(caller):
            return await self.local.list_tasks(caller, request)

        def sub(pools: list[str], after: int, limit: int) -> pb.ListTasksRequest:
            return pb.ListTasksRequest(pools=pools, statuses=request.statuses, after=after, limit=limit)

        return await self._listing(caller, request, False, sub, "tasks", "ListTasks", self.local.list_tasks)

    async def search_tasks(self, caller: Caller, request: cpb.SearchTasksRequest) -> pb.ListTasksResponse:
        """ListTasks with the console's filters (``cronoq.console.v1``), over every shard."""
        if self._local_only(caller):
            return await self.local.search_tasks(caller, request)

        def sub(pools: list[str], after: int, limit: int) -> cpb.SearchTasksRequest:
            part = cpb.SearchTasksRequest()
            part.CopyFrom(request)
            part.list.CopyFrom(pb.ListTasksRequest(pools=pools, statuses=request.list.statuses, after=after,
                                                   limit=limit))  # fmt: skip
            return part

        return await self._listing(caller, request.list, request.newest_first, sub, "console", "SearchTasks",
                                   self.local.search_tasks)  # fmt: skip

    async def _listing(self, caller: Caller, request: pb.ListTasksRequest, newest_first: bool,
                       sub: Callable[[list[str], int, int], Any], service: str, method: str,
                       local: Callable[[Any, Any], Awaitable[pb.ListTasksResponse]]
                       ) -> pb.ListTasksResponse:  # fmt: skip
        """A listing of every shard the filter concerns (see ``merge.pages``)."""
        caller.require(Role.CLIENT)
        for pool in request.pools:
            self._check_pool(caller, pool)
        wanted = set(request.pools)
        limit = request.limit or 100
        limit = max(1, min(limit, self.limits.max_list))
        shards = [shard for shard in self._ordered
                  if (any(pool in wanted for pool in self._pools_of(shard)) if wanted
                      else self._concerns(caller, shard))]  # fmt: skip

        async def ask(shard: ShardSection, after: int, remaining: int) -> pb.ListTasksResponse | None:
            part = sub([pool for pool in self._pools_of(shard) if pool in wanted], after, remaining)
            try:
                answer: pb.ListTasksResponse = await self._ask(caller, shard, service, method, part,
                                                               partial(local, caller, part))  # fmt: skip
            except _Unreachable:
                return None
            return answer

        return await merge.pages(shards, request.after, limit, newest_first, ask)

    async def task_detail(self, caller: Caller, request: pb.GetRequest) -> cpb.TaskDetail:
        """A task's detail (``cronoq.console.v1``): from the shard of its id, or of its key."""
        if self._local_only(caller) or _malformed(request.task):
            return await self.local.task_detail(caller, request)
        caller.require(Role.CLIENT)
        if _by_key(request.task):
            shard, info = await self._find_key(caller, request.task.key, cancelling=False)
            request = pb.GetRequest(task=pb.TaskRef(id=info.id))
            peer = None if shard.name == self.local_name else self.peers.peer(shard.name)
        else:
            return await self._at_task_shard(
                caller, request.task.id, partial(self.local.task_detail, caller, request),
                lambda peer: self.calls.call(peer, "console", "GetTaskDetail", request, caller,
                                           self.limits.request_timeout_s),
            )  # fmt: skip
        if peer is None:
            return await self.local.task_detail(caller, request)
        detail: cpb.TaskDetail = await self.calls.call(peer, "console", "GetTaskDetail", request, caller,
                                                     self.limits.request_timeout_s)  # fmt: skip
        return detail

    async def _ask(self, caller: Caller, shard: ShardSection, service: str, method: str, request: Any,
                   local: Callable[[], Awaitable[Any]]) -> Any:  # fmt: skip
        """One shard's answer to a read; ``_Unreachable`` when it cannot be asked."""
        if shard.name == self.local_name:
            try:
                return await local()
            except Exception as exc:
                if status_of(exc) in MISSING:
                    raise _Unreachable from exc
                raise
        peer = self._reachable(caller, shard)
        if peer is None:
            raise _Unreachable
        try:
            return await self.calls.call(peer, service, method, request, caller, PEER_READ_TIMEOUT_S)
        except RouteError as exc:
            if exc.code in MISSING:
                raise _Unreachable from exc
            raise

    async def watch(self, caller: Caller, request: pb.WatchRequest) -> AsyncIterator[pb.StatusEvent]:
        """Subscribe on every shard the filter concerns, then merge their streams. The merged
        stream ends when any shard's stream ends. Shards that cannot be asked at the start are
        noted as unavailable and left out."""
        if self._local_only(caller):
            return await self.local.watch(caller, request)
        caller.require(Role.CLIENT)
        for pool in request.pools:
            self._check_pool(caller, pool)
        wanted = set(request.pools)
        sources: list[AsyncIterator[pb.StatusEvent]] = []
        calls: list[Any] = []
        missing: list[str] = []
        # Once a pool has moved, an id's shard bits name where the task was created, not where
        # it is: every shard watches for every id.
        moved = any(placement.version > 1 for placement in self.topology.placements().values())
        try:
            for shard in self._ordered:
                pools = [pool for pool in self._pools_of(shard) if pool in wanted]
                ids = [task_id for task_id in request.ids if moved or task_id >> SHARD_BITS == shard.number]
                if (wanted and not pools) or (request.ids and not ids and not request.keys):
                    continue
                if not self._concerns(caller, shard):
                    continue
                sub = pb.WatchRequest(pools=pools, ids=ids, keys=request.keys, all_transitions=request.all_transitions)
                if shard.name == self.local_name:
                    sources.append(await self.local.watch(caller, sub))
                    continue
                peer = self._reachable(caller, shard)
                call = None if peer is None else await self.calls.open_watch(peer, sub, caller)
                if call is None:
                    missing.append(shard.name)
                    continue
                calls.append(call)
                sources.append(remote_events(peer, call))  # type: ignore[arg-type]
        except BaseException:
            for call in calls:
                call.cancel()
            for source in sources:
                with contextlib.suppress(Exception):
                    await source.aclose()  # type: ignore[attr-defined]
            raise
        _note_unavailable(missing)
        return merge.streams(sources)

    # ------------------------------------------------------------------------------ Admin

    async def snapshot(self, caller: Caller, request: pb.Empty | None = None) -> pb.SnapshotResponse:
        if self._local_only(caller):
            return await self.local.snapshot(caller, request)
        parts, missing = await self._read_all(caller, "Snapshot", self.local.snapshot)
        return merge.snapshots(parts, missing)

    async def metrics_text(self, caller: Caller) -> tuple[bytes, str]:
        return await self.local.metrics_text(caller)  # Prometheus is scraped per server

    async def list_workers(self, caller: Caller, request: pb.Empty | None = None) -> pb.ListWorkersResponse:
        return await self._merged_read(caller, "admin", "ListWorkers", self.local.list_workers,
                                       pb.ListWorkersResponse(), "workers")  # fmt: skip

    async def list_recurring(self, caller: Caller, request: pb.Empty | None = None) -> pb.ListRecurringResponse:
        return await self._merged_read(caller, "admin", "ListRecurring", self.local.list_recurring,
                                       pb.ListRecurringResponse(), "schedules")  # fmt: skip

    async def _merged_read(self, caller: Caller, service: str, method: str,
                           local: Callable[[Any, pb.Empty], Awaitable[merge.Listing]], out: merge.Listing,
                           field: str) -> merge.Listing:  # fmt: skip
        """A read of every shard (metrics role): the entries of every answer's ``field`` in
        ``out``, and the shards left out in its ``unavailable_shards``."""
        if self._local_only(caller):
            return await local(caller, pb.Empty())
        parts, missing = await self._read_all(caller, method, local, service)
        out.unavailable_shards.extend(missing)
        merged: merge.Listing = merge.concatenated(out, field, parts)
        return merged

    async def _read_all(self, caller: Caller, method: str, local: Callable[[Any, pb.Empty], Awaitable[Any]],
                        service: str = "admin") -> tuple[list[Any], list[str]]:  # fmt: skip
        """An Admin read (metrics role) of every shard: the answers and the shards left out."""
        caller.require(Role.METRICS)
        answers, missing = await self._fan_out(
            caller,
            lambda: local(caller, pb.Empty()),
            lambda peer: self.calls.call(peer, service, method, pb.Empty(), caller, PEER_READ_TIMEOUT_S),
        )
        parts = [answer for _, answer in answers]
        for part in parts:
            for name in part.unavailable_shards:
                if name not in missing:
                    missing.append(name)
        return parts, missing

    async def add_recurring(self, caller: Caller, request: pb.RecurringRequest) -> pb.Empty:
        if self._local_only(caller):
            return await self.local.add_recurring(caller, request)
        caller.require(Role.ADMIN)
        return await self._retrying(partial(self._add_recurring, caller, request))

    async def _add_recurring(self, caller: Caller, request: pb.RecurringRequest) -> pb.Empty:
        peer = self._peer_for_spec(caller, request.template)
        if peer is None:
            return await self.local.add_recurring(caller, request)
        response: pb.Empty = await self.calls.call(peer, "admin", "AddRecurring", request, caller,
                                                 self.limits.request_timeout_s)  # fmt: skip
        return response

    async def remove_recurring(self, caller: Caller, request: pb.RemoveRecurringRequest) -> pb.RemoveRecurringResponse:
        if self._local_only(caller):
            return await self.local.remove_recurring(caller, request)
        removed = await self._on_schedule(caller, request, "admin", "RemoveRecurring", self.local.remove_recurring,
                                          lambda answer: answer.removed)  # fmt: skip
        return pb.RemoveRecurringResponse(removed=removed)

    async def _on_schedule(self, caller: Caller, request: Any, service: str, method: str,
                           local: Callable[[Any, Any], Awaitable[Any]],
                           done: Callable[[Any], bool]) -> bool:  # fmt: skip
        """An admin call about schedule ``request.name``. Schedule names are per shard: every shard
        is asked, and the answer is whether one of them had it (``done``)."""
        caller.require(Role.ADMIN)
        answers, missing = await self._fan_out(
            caller,
            lambda: local(caller, request),
            lambda peer: self.calls.call(peer, service, method, request, caller, self.limits.request_timeout_s),
        )
        found = any(done(answer) for _, answer in answers)
        if not found and missing:
            raise RouteError(Status.UNAVAILABLE,
                             f"schedule {request.name!r} not found in the reachable shards; shards "
                             f"{', '.join(missing)} could not be asked")  # fmt: skip
        return found

    # ------------------------------------------------------------------------------ Console

    async def list_shards(self, caller: Caller, request: pb.Empty | None = None) -> cpb.ListShardsResponse:
        """Every shard's leader, as it describes itself (``cronoq.console.v1``)."""
        return await self._merged_read(caller, "console", "ListShards", self._local_shards,
                                       cpb.ListShardsResponse(), "shards")  # fmt: skip

    async def _local_shards(self, caller: Caller, request: pb.Empty) -> cpb.ListShardsResponse:
        """This shard as its leader describes itself, with each replica the configuration lists
        (``[[shards]] replicas``) as it answers, asked with the caller's credentials."""
        answer = await self.local.list_shards(caller, request)
        local = self.config.local_shard()
        if local is not None and local.replicas and answer.shards:
            replicas = await asyncio.gather(*(self._describe_replica(caller, endpoint) for endpoint in local.replicas))
            answer.shards[0].replicas.extend(replicas)
        return answer

    async def _describe_replica(self, caller: Caller, endpoint: str) -> cpb.ReplicaInfo:
        unavailable = cpb.ReplicaInfo(endpoint=endpoint, state="unavailable")
        if caller.certificate and not caller.authorization:
            unavailable.error = "not asked: a client certificate cannot be passed on"
            return unavailable
        try:
            channel = self.peers.replica_channel(endpoint)
        except ValueError as refused:
            unavailable.error = f"not asked: {refused}"
            return unavailable
        try:
            info: cpb.ReplicaInfo = await cpbg.ConsoleStub(channel).DescribeReplica(  # type: ignore[no-untyped-call]
                pb.Empty(), metadata=self.calls.metadata(caller, None), timeout=REPLICA_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() is Status.UNAVAILABLE:
                unavailable.error = "not reachable"
            elif exc.code() is Status.DEADLINE_EXCEEDED:
                unavailable.error = f"no answer within {REPLICA_TIMEOUT_S:g} s"
            else:
                unavailable.error = f"{exc.code().name.lower()}: {(exc.details() or '')[:200]}"
            return unavailable
        info.endpoint = endpoint
        return info

    async def list_schedules(self, caller: Caller, request: pb.Empty | None = None) -> cpb.ListSchedulesResponse:
        """Every shard's schedules with their paused state and next runs (``cronoq.console.v1``)."""
        return await self._merged_read(caller, "console", "ListSchedules", self.local.list_schedules,
                                       cpb.ListSchedulesResponse(), "schedules")  # fmt: skip

    async def pause_schedule(self, caller: Caller, request: cpb.ScheduleRequest) -> cpb.ScheduleResponse:
        return await self._switch_schedule(caller, request, "PauseSchedule", self.local.pause_schedule)

    async def resume_schedule(self, caller: Caller, request: cpb.ScheduleRequest) -> cpb.ScheduleResponse:
        return await self._switch_schedule(caller, request, "ResumeSchedule", self.local.resume_schedule)

    # ------------------------------------------------------------------------------ Pool moves

    async def move_pool(self, caller: Caller, request: cpb.MovePoolRequest) -> cpb.MoveStatus:
        """To the shard serving the pool (docs/pool-moves.md)."""
        return await self._on_pool(caller, request.pool, "MovePool", self.local.move_pool, request, Role.ADMIN)

    async def get_move(self, caller: Caller, request: cpb.MoveRequest) -> cpb.MoveStatus:
        return await self._on_pool(caller, request.pool, "GetMove", self.local.get_move, request, Role.METRICS)

    async def abort_move(self, caller: Caller, request: cpb.MoveRequest) -> cpb.MoveStatus:
        return await self._on_pool(caller, request.pool, "AbortMove", self.local.abort_move, request, Role.ADMIN)

    async def _on_pool(self, caller: Caller, pool: str, method: str, local: Callable[[Any, Any], Awaitable[_R]],
                       request: Any, role: Role) -> _R:  # fmt: skip
        """A console call about ``pool``, answered by the shard serving it."""
        if self._local_only(caller):
            return await local(caller, request)
        caller.require(role)
        self._check_pool(caller, pool)

        async def once() -> _R:
            peer = self._peer_for(caller, self._shard_of_pool(pool), f"pool {pool!r}")
            if peer is None:
                return await local(caller, request)
            answer: _R = await self.calls.call(peer, "console", method, request, caller, self.limits.request_timeout_s)
            return answer

        return await self._retrying(once)

    async def _switch_schedule(self, caller: Caller, request: cpb.ScheduleRequest, method: str,
                               local: Callable[[Any, Any], Awaitable[cpb.ScheduleResponse]]
                               ) -> cpb.ScheduleResponse:  # fmt: skip
        if self._local_only(caller):
            return await local(caller, request)
        found = await self._on_schedule(caller, request, "console", method, local, lambda answer: answer.found)
        return cpb.ScheduleResponse(found=found)


def _moved_shard(exc: BaseException) -> str | None:
    """The shard a refusal says a task moved to with its pool (``cronoq-task-moved``), if it is one."""
    if status_of(exc) is not Status.FAILED_PRECONDITION:
        return None
    metadata = dict((key, value) for key, value in getattr(exc, "metadata", ()) if isinstance(value, str))
    return metadata.get(SHARD_KEY) if MOVED_KEY in metadata else None


def _by_key(ref: pb.TaskRef) -> bool:
    return bool(ref.WhichOneof("target") == "key")


def _malformed(ref: pb.TaskRef) -> bool:
    which = ref.WhichOneof("target")
    return which is None or (which == "key" and not ref.key)


class _Unreachable(Exception):
    """A shard that a read could not ask."""


def _with_id(request: pb.WaitRequest, task_id: int) -> pb.WaitRequest:
    out = pb.WaitRequest(task=pb.TaskRef(id=task_id))
    if request.HasField("timeout_s"):
        out.timeout_s = request.timeout_s
    return out


def shards_of(sections: Sequence[ShardSection]) -> list[str]:
    return [shard.name for shard in sections]


def _stale_refusal(exc: Exception) -> tuple[str, Placement] | None:
    """The placement a refusal as routed on an old placement names: a ``RouteError`` from a peer,
    or the local API's error, which carries the same ``code`` (a status or an enum of statuses
    with ``grpc``) and ``metadata``."""
    code = getattr(exc, "code", None)
    if getattr(code, "grpc", code) is not Status.FAILED_PRECONDITION:
        return None
    metadata = getattr(exc, "metadata", None)
    return stale_placement(metadata) if isinstance(metadata, tuple) else None
