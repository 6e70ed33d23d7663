"""The server's calls, independent of the transport.

Each public coroutine of ``Api`` takes the caller's ``Principal`` and a ``cronoq.v1`` request
message and returns the response message, or raises ``ApiError`` (and nothing else). The gRPC
servicers call these directly; the HTTP gateway turns JSON into the same request messages and
calls the same methods, so authorization, limits and error mapping live in one place.

The ``Api`` object outlives leadership terms: ``service`` is the shard service of the current
term, ``None`` while this server is a standby (every call then answers UNAVAILABLE).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from functools import wraps
from typing import ParamSpec, TypeVar

from cronoq import __version__
from cronoq.cluster.topology import MOVED_KEY, POOL_KEY, VERSION_KEY, Topology
from cronoq.config import Config, Role
from cronoq.engine import Core, Snapshot, TaskInfo, TaskRef, TaskSpec, TaskStatus
from cronoq.engine.cron import CronSchedule
from cronoq.engine.recurring import RUN_KEY_SUFFIX_LEN, is_run_key
from cronoq.engine.types import AdmissionError, ConfigError, SubmitCode
from cronoq.engine.views import RecurringInfo
from cronoq.proto import console_pb2 as cpb
from cronoq.proto import cronoq_pb2 as pb
from cronoq.shard.driver import StoreTrouble
from cronoq.shard.service import ShardService, Subscription
from cronoq.stores.pool_moves import MoveRow

from . import convert
from .auth import Principal
from .errors import ApiError, Code, from_exception
from .history import PAYLOAD_PREVIEW_BYTES, task_detail, task_query
from .moves import ABORTABLE, PoolMoves
from .telemetry import TRACEPARENT, outgoing_traceparent

__all__ = ["DEFAULT_LIST_LIMIT", "Api", "default_pool_name"]

DEFAULT_LIST_LIMIT = 100
NEXT_RUNS = 5
"""How many next starts of a schedule the console is told."""

P = ParamSpec("P")
R = TypeVar("R")


def default_pool_name(config: Config) -> str:
    """Where a task, schedule or worker without a pool goes: the pool named "default", or else the
    first configured one. Every node resolves it alike, before any credential is checked, and
    hands the engine the resolved name (a shard's engine knows only its own pools)."""
    names = [pool.name for pool in config.pools]
    if "default" in names or not names:
        return "default"
    return names[0]


def _api_errors(method: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Let only ``ApiError`` out of a handler."""

    @wraps(method)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await method(*args, **kwargs)
        except ApiError:
            raise
        except Exception as exc:
            raise from_exception(exc) from exc

    return wrapper


MAX_NAME_LEN = 200
"""Longest pool or shard name a move request may carry."""


class Api:
    def __init__(
        self, config: Config, *, clock: Callable[[], int] = time.time_ns, topology: Topology | None = None
    ) -> None:
        self.config = config
        # The placements this server was built from (its shard's durable record, or the file).
        self.topology = topology if topology is not None else Topology.from_config(config)
        self.limits = config.limits
        self.clock = clock
        self._service: ShardService | None = None
        self._leading_since = 0
        self.address = config.server.grpc_addr
        """This server's gRPC address, as bound (the server sets it once listening)."""
        self.pools: tuple[str, ...] = tuple(pool.name for pool in config.local_pools())
        self._pool_set = frozenset(self.pools)
        self._all_pools = frozenset(pool.name for pool in config.pools)
        self.default_pool = default_pool_name(config)
        self._shard_number = config.shard_number()
        # Commit failures of every leadership of this process (the drivers count into it).
        self.store_trouble = StoreTrouble()
        # Pool moves (docs/pool-moves.md): set by the server when its shard keeps placements.
        self.moves: PoolMoves | None = None
        self.relead: Callable[[], None] = lambda: None
        self.drain: Callable[[MoveRow, bool], None] = lambda move, start: None
        """Start (True) or stop draining a pool for ``move`` (the app's ``_drain``)."""
        self.incoming: frozenset[str] = frozenset()
        """Pools handed to this shard that the next leadership will serve (UNAVAILABLE until then)."""
        self.leaving: dict[str, str] = {}
        """Pools this leader is handing over right now, and to which shard (UNAVAILABLE meanwhile)."""

    def adopt(self, config: Config, topology: Topology) -> None:
        """Serve the pools ``config`` gives this shard (as its durable placements place them)."""
        self.config = config
        self.topology = topology
        self.pools = tuple(pool.name for pool in config.local_pools())
        self._pool_set = frozenset(self.pools)
        self.incoming = frozenset()

    # ------------------------------------------------------------------------------- helpers

    @property
    def service(self) -> ShardService | None:
        return self._service

    @service.setter
    def service(self, service: ShardService | None) -> None:
        if service is not None and service is not self._service:
            self._leading_since = self.clock()
        self._service = service

    def current(self) -> ShardService:
        service = self.service
        if service is None or not service.leading:
            raise ApiError.unavailable()
        return service

    @property
    def serving(self) -> bool:
        """True while this server leads its shard and admits work."""
        service = self.service
        return service is not None and service.leading

    def wait_limit(self, requested: float | None) -> float:
        """How long a server-side wait may last: the request's timeout capped at max_wait_s."""
        cap = self.limits.max_wait_s
        if requested is None:
            return cap
        return min(convert.duration_s(requested, "timeout"), cap)

    def check_pool(self, principal: Principal, pool: str) -> None:
        """A pool a request names: in scope, known, and served here."""
        principal.check_pool(pool, self._all_pools)
        if self.leaving and pool in self.leaving:
            raise ApiError.unavailable(f"pool {pool!r} is moving to shard {self.leaving[pool]!r}; retry shortly")
        if pool not in self._pool_set and pool in self.incoming:
            raise ApiError.unavailable(f"pool {pool!r} is being handed to this shard; retry shortly")
        if pool not in self._pool_set:
            shard = self.config.shard_of_pool(pool)
            assert shard is not None
            metadata = [("cronoq-shard", shard.name), ("cronoq-shard-endpoint", shard.endpoint)]
            placement = self.topology.placement(pool)
            if placement is not None and placement.shard == shard.name:
                # Names the placement's version, so a node routing on an older one learns it.
                metadata += [(POOL_KEY, pool), (VERSION_KEY, str(placement.version))]
            raise ApiError(
                Code.FAILED_PRECONDITION,
                f"pool {pool!r} is served by shard {shard.name!r} at {shard.endpoint}",
                tuple(metadata),
            )

    def resolve_pool(self, principal: Principal, requested: str | None) -> str:
        """The pool a call acts on (``requested``, or the default pool), once the caller may use it
        and this shard serves it."""
        pool = requested or self.default_pool
        self.check_pool(principal, pool)
        return pool

    def _scope(self, principal: Principal, pools: Sequence[str]) -> list[str] | None:
        """The pools a listing covers: the named ones (each checked), or every visible one
        (``None`` when that is every pool)."""
        if pools:
            for pool in pools:
                self.check_pool(principal, pool)
            return list(dict.fromkeys(pools))
        if not principal.scoped:
            return None
        return principal.visible(self.pools)

    def _spec(self, principal: Principal, message: pb.TaskSpec, now: int, traceparent: str | None) -> TaskSpec:
        """``traceparent``: the request's span (``outgoing_traceparent()``, once per request), which
        becomes the task's trace unless the task carries one."""
        spec = convert.task_spec(message, now, self.limits)
        if spec.key is not None and is_run_key(spec.key):
            raise ApiError.invalid(
                "key: keys ending in '@<UTC RFC 3339 time>' (such as 'report@2026-03-08T07:30:00Z') are "
                "reserved for the runs of recurring schedules"
            )
        spec.pool = self.resolve_pool(principal, spec.pool)
        spec.tenant = principal.tenant_for(spec.tenant)
        self._check_one_shard(spec)
        # OpenTelemetry: the request's span becomes the task's trace (workers see the tag).
        if traceparent is not None and TRACEPARENT not in spec.tags:
            spec.tags = {**spec.tags, TRACEPARENT: traceparent}
        return spec

    def _check_one_shard(self, spec: TaskSpec) -> None:
        """Dependencies and resources never span shards (ids carry the number of the shard that
        created them: with pool moves, a task of another shard's id may be held here, and the
        engine answers for it)."""
        if not self.config.sharded:
            return
        for dep in spec.deps:
            if isinstance(dep.target, int) and dep.target >> 56 != self._shard_number and self.moves is None:
                raise ApiError.invalid(
                    f"dependency {dep.target} is a task of another shard; a task can only "
                    f"depend on tasks of its own shard"
                )
        for name in spec.resources:
            try:
                owner = self.config.shard_of_resource(name)
            except KeyError:
                continue  # unknown: the engine reports it
            if owner is not None and owner.number != self._shard_number:
                raise ApiError.invalid(
                    f"resource {name!r} belongs to shard {owner.name!r}; a task can only use its own shard's resources"
                )

    def _foreign_dependency(self, exc: AdmissionError, specs: Sequence[TaskSpec]) -> ApiError | None:
        """The refusal of a dependency on a task another shard created and this one does not hold:
        with pool moves the id alone no longer decides (a moved pool's tasks keep their ids), so it
        is told once the engine did not find it. Also a pool that left the engine meanwhile."""
        if exc.code is SubmitCode.UNKNOWN_POOL and self.moves is not None:
            # Checked as served, then the engine let go of it for a move before the submission
            # reached it: the pool is changing shards, and the caller retries.
            pool = specs[exc.index or 0].pool
            if pool is not None and pool in self._all_pools:
                return ApiError.unavailable(f"pool {pool!r} is changing shards; retry shortly")
        if exc.code is not SubmitCode.UNKNOWN_DEPENDENCY or not self.config.sharded:
            return None
        spec = specs[exc.index or 0]
        for dep in spec.deps:
            target = dep.target
            if isinstance(target, int) and target >> 56 != self._shard_number and exc.message.endswith(f" {target}"):
                where = "" if exc.index is None else f"task {exc.index}: "
                return ApiError.invalid(
                    f"{where}dependency {target} is a task of another shard; a task can only "
                    f"depend on tasks of its own shard"
                )
        return None

    async def _visible_info(self, principal: Principal, ref: TaskRef) -> tuple[TaskInfo, bool]:
        """A task the caller may see; tasks of other pools look like they do not exist."""
        found = await self.current().get(ref)
        if found is None and isinstance(ref, int):
            await self._check_moved(principal, ref)
        if found is None or not principal.sees(found[0].pool):
            raise ApiError.not_found("task not found")
        return found

    async def _check_moved(self, principal: Principal, task_id: int) -> None:
        """Refuse naming the shard a task was handed to with its pool (FAILED_PRECONDITION, with
        ``cronoq-task-moved``), when the caller may see that pool; return otherwise."""
        if self.moves is None:
            return
        moved = await self.moves.forwarded(task_id)
        if moved is None or not principal.sees(moved[0]):
            return
        pool, shard_name, version = moved
        try:
            shard = self.config.shard(shard_name)
        except KeyError:
            return
        raise ApiError(
            Code.FAILED_PRECONDITION,
            f"task {task_id} moved with pool {pool!r} to shard {shard.name!r} at {shard.endpoint}",
            (
                ("cronoq-shard", shard.name),
                ("cronoq-shard-endpoint", shard.endpoint),
                (MOVED_KEY, str(task_id)),
                (POOL_KEY, pool),
                (VERSION_KEY, str(version)),
            ),
        )

    async def _check_references(self, principal: Principal, specs: Sequence[TaskSpec]) -> None:
        """For pool-scoped callers, before admission: keys of the new tasks must not be in use
        in pools outside the scope, and dependencies must not name tasks of such pools. Nor may
        they name a key no task holds yet (except one the batch defines): keys are one namespace
        across pools, so the task that takes it later may be in a pool outside the scope, and an
        awaiting child would learn of it."""
        if not principal.scoped:
            return
        refs: list[TaskRef] = []
        for spec in specs:
            if spec.key is not None:
                refs.append(spec.key)
            refs.extend(dep.target for dep in spec.deps)
        if not refs:
            return

        def pools_of(core: Core, now: int) -> list[str | None]:
            out: list[str | None] = []
            for ref in refs:
                info = core.get(ref)
                out.append(None if info is None else info.pool)
            return out

        found: list[str | None] = await self.current().driver.call(pools_of)
        defined = {spec.key for spec in specs if spec.key is not None}
        position = 0
        for index, spec in enumerate(specs):
            where = "" if len(specs) == 1 else f"task {index}: "
            if spec.key is not None:
                pool = found[position]
                position += 1
                if pool is not None and not principal.sees(pool):
                    raise ApiError(
                        Code.FAILED_PRECONDITION, f"{where}key {spec.key!r} is in use outside this credential's pools"
                    )
            for dep in spec.deps:
                pool = found[position]
                position += 1
                if pool is not None and not principal.sees(pool):
                    raise ApiError.not_found(f"{where}unknown dependency {dep.target!r}")
                if pool is None and isinstance(dep.target, str) and dep.target not in defined:
                    raise ApiError.not_found(
                        f"{where}unknown dependency {dep.target!r} (a credential scoped to "
                        f"pools cannot wait for a key no task holds yet)"
                    )

    async def _check_duplicates(self, principal: Principal, ids: Sequence[int]) -> None:
        """A duplicate key resolves to an existing task: refuse one the caller may not see."""
        if not principal.scoped:
            return
        service = self.current()
        for task_id in ids:
            found = await service.get(task_id)
            if found is not None and not principal.sees(found[0].pool):
                raise ApiError(Code.FAILED_PRECONDITION, "the key is in use outside this credential's pools")

    # ------------------------------------------------------------------------------- Tasks

    @_api_errors
    async def submit(self, principal: Principal, request: pb.SubmitRequest) -> pb.SubmitResponse:
        principal.require(Role.CLIENT)
        if request.HasField("wait_timeout_s") and not request.wait:
            raise ApiError.invalid("wait_timeout_s is only valid with wait")
        timeout = self.wait_limit(request.wait_timeout_s if request.HasField("wait_timeout_s") else None)
        service = self.current()
        spec = self._spec(principal, request.task, self.clock(), outgoing_traceparent())
        await self._check_references(principal, [spec])
        try:
            task_id, duplicate = await service.submit(spec)
        except AdmissionError as exc:
            raise self._foreign_dependency(exc, [spec]) or exc from None
        if duplicate:
            await self._check_duplicates(principal, [task_id])
        response = pb.SubmitResponse(id=task_id, duplicate=duplicate)
        if request.wait:
            result = await service.wait(task_id, timeout)
            response.result.CopyFrom(convert.task_result(result))
        return response

    @_api_errors
    async def submit_batch(self, principal: Principal, request: pb.SubmitBatchRequest) -> pb.SubmitBatchResponse:
        principal.require(Role.CLIENT)
        count = len(request.tasks)
        if count > self.limits.max_tasks_per_batch:
            raise ApiError.invalid(f"a batch may hold at most {self.limits.max_tasks_per_batch} tasks, not {count}")
        if count == 0:
            return pb.SubmitBatchResponse()
        service = self.current()
        now = self.clock()
        traceparent = outgoing_traceparent()
        specs: list[TaskSpec] = []
        for index, message in enumerate(request.tasks):
            try:
                specs.append(self._spec(principal, message, now, traceparent))
            except ApiError as err:
                raise ApiError(err.code, f"task {index}: {err.message}", err.metadata) from None
        await self._check_references(principal, specs)
        try:
            admitted = await service.submit_batch(specs)
        except AdmissionError as exc:
            raise self._foreign_dependency(exc, specs) or exc from None
        duplicates = [task_id for task_id, duplicate in admitted if duplicate]
        if duplicates:
            await self._check_duplicates(principal, duplicates)
        return pb.SubmitBatchResponse(
            tasks=[pb.SubmitResponse(id=task_id, duplicate=duplicate) for task_id, duplicate in admitted]
        )

    @_api_errors
    async def get(self, principal: Principal, request: pb.GetRequest) -> pb.TaskInfo:
        principal.require(Role.CLIENT)
        ref = convert.task_ref(request.task)
        info, available = await self._visible_info(principal, ref)
        return convert.task_info(info, available)

    @_api_errors
    async def list_tasks(self, principal: Principal, request: pb.ListTasksRequest) -> pb.ListTasksResponse:
        return await self.search_tasks(principal, cpb.SearchTasksRequest(list=request))

    @_api_errors
    async def search_tasks(self, principal: Principal, request: cpb.SearchTasksRequest) -> pb.ListTasksResponse:
        """ListTasks with the console's filters: live tasks, then finished ones of the history."""
        principal.require(Role.CLIENT)
        listing = request.list
        pools = self._scope(principal, list(listing.pools))
        query = task_query(request, pools, self.limits)
        service = self.current()
        if pools is not None and not pools:
            return pb.ListTasksResponse()
        limit = listing.limit or DEFAULT_LIST_LIMIT
        limit = max(1, min(limit, self.limits.max_list))
        rows, next_after = await service.list_page(query, int(listing.after), limit, request.newest_first)
        response = pb.ListTasksResponse(next_after=next_after or 0)
        for info in rows:
            response.tasks.append(convert.task_info(info, info.has_output and info.status is TaskStatus.SUCCEEDED))
        return response

    @_api_errors
    async def task_detail(self, principal: Principal, request: pb.GetRequest) -> cpb.TaskDetail:
        """A task with its stored spec and recorded transitions (``cronoq.console.v1``)."""
        principal.require(Role.CLIENT)
        info, available = await self._visible_info(principal, convert.task_ref(request.task))
        service = self.current()
        detail = task_detail(info, available, await service.stored_task(info.id), await service.transitions(info.id))
        if available:
            output = (await service.wait(info.id, 0.0)).output
            if output is not None:
                detail.output_preview = output.data[:PAYLOAD_PREVIEW_BYTES]
                detail.output_bytes = len(output.data)
                detail.output_content_type = output.content_type
        return detail

    @_api_errors
    async def wait(self, principal: Principal, request: pb.WaitRequest) -> pb.TaskResult:
        principal.require(Role.CLIENT)
        ref = convert.task_ref(request.task)
        timeout = self.wait_limit(request.timeout_s if request.HasField("timeout_s") else None)
        service = self.current()
        if principal.scoped or (self.moves is not None and isinstance(ref, int)):
            info, _ = await self._visible_info(principal, ref)  # also: was the task moved away?
            ref = info.id
        return convert.task_result(await service.wait(ref, timeout))

    @_api_errors
    async def cancel(self, principal: Principal, request: pb.CancelRequest) -> pb.CancelResponse:
        principal.require(Role.CLIENT)
        ref = convert.task_ref(request.task)
        service = self.current()
        if principal.scoped or (self.moves is not None and isinstance(ref, int)):
            info, _ = await self._visible_info(principal, ref)  # also: was the task moved away?
            ref = info.id
        return pb.CancelResponse(cancelled=await service.cancel(ref))

    @_api_errors
    async def watch(self, principal: Principal, request: pb.WatchRequest) -> AsyncGenerator[pb.StatusEvent, None]:
        """Subscribe now (errors are raised here), then stream events from the returned iterator.

        The iterator ends by raising ``ApiError``: UNAVAILABLE when this server stops leading or
        shuts down, DATA_LOSS when the reader fell too far behind."""
        principal.require(Role.CLIENT)
        pools = self._scope(principal, list(request.pools))
        keys = [convert.text(key, "keys") for key in request.keys]
        service = self.current()
        subscription = service.watch(
            None if pools is None else set(pools), list(request.ids), keys, request.all_transitions
        )
        return _events(subscription)

    # ------------------------------------------------------------------------------- Admin

    async def _snapshot_parts(self, principal: Principal) -> tuple[Snapshot, dict[str, int]]:
        """The shard's snapshot and connected workers per pool, as far as the caller may see."""
        service = self.current()
        snap = await service.snapshot()
        workers: dict[str, int] = {}
        for session in service.workers_in(None):
            if principal.sees(session.pool):
                workers[session.pool] = workers.get(session.pool, 0) + 1
        if principal.scoped:
            snap = _visible_part(snap, principal)
        return snap, workers

    @_api_errors
    async def snapshot(self, principal: Principal, request: pb.Empty | None = None) -> pb.SnapshotResponse:
        principal.require(Role.METRICS)
        snap, workers = await self._snapshot_parts(principal)
        return convert.snapshot_response(snap, workers)

    @_api_errors
    async def metrics_text(self, principal: Principal) -> tuple[bytes, str]:
        """Prometheus exposition of the snapshot: ``(body, content type)`` (metrics role)."""
        from .metrics import CONTENT_TYPE, ProcessFigures, render

        principal.require(Role.METRICS)
        snap, workers = await self._snapshot_parts(principal)
        service = self.current()
        process = None
        if not principal.scoped:  # shard-wide facts: not for a caller that sees only some pools
            trouble = self.store_trouble
            process = ProcessFigures(
                leader_epoch=service.driver.epoch,
                store_commit_errors=trouble.commit_errors,
                store_fenced_commits=trouble.fenced_commits,
            )
        return render(snap, workers, service.desired, process), CONTENT_TYPE

    @_api_errors
    async def add_recurring(self, principal: Principal, request: pb.RecurringRequest) -> pb.Empty:
        principal.require(Role.ADMIN)
        spec = convert.recurring_spec(request, self.limits)
        template = spec.template
        longest = self.limits.max_key_len - RUN_KEY_SUFFIX_LEN
        if template.key is not None and len(template.key) > longest:
            raise ApiError.invalid(
                f"template.key is too long: each run's key is '<key>@<start in UTC>', "
                f"{RUN_KEY_SUFFIX_LEN} characters more, and keys may have at most "
                f"{self.limits.max_key_len} (limits.max_key_len), so the template's key at "
                f"most {max(0, longest)}"
            )
        template.pool = self.resolve_pool(principal, template.pool)
        template.tenant = principal.tenant_for(template.tenant)
        service = self.current()
        if principal.scoped:
            for info in await service.list_recurring():
                if principal.sees(info.pool):
                    continue
                # Replacing a schedule of a pool outside the scope would move it into the caller's;
                # sharing its key would take its runs' keys first (and so silence its runs).
                if info.name == spec.name:
                    raise ApiError(
                        Code.FAILED_PRECONDITION, f"schedule {spec.name!r} exists outside this credential's pools"
                    )
                if template.key is not None and info.key == template.key:
                    raise ApiError(
                        Code.FAILED_PRECONDITION,
                        f"key {template.key!r} is in use by a schedule outside this credential's pools",
                    )
        await service.add_recurring(spec)
        return pb.Empty()

    @_api_errors
    async def remove_recurring(
        self, principal: Principal, request: pb.RemoveRecurringRequest
    ) -> pb.RemoveRecurringResponse:
        principal.require(Role.ADMIN)
        service = self.current()
        if principal.scoped:
            infos = {info.name: info for info in await service.list_recurring()}
            info = infos.get(request.name)
            if info is None or not principal.sees(info.pool):
                return pb.RemoveRecurringResponse(removed=False)
        return pb.RemoveRecurringResponse(removed=await service.remove_recurring(request.name))

    @_api_errors
    async def list_workers(self, principal: Principal, request: pb.Empty | None = None) -> pb.ListWorkersResponse:
        principal.require(Role.METRICS)
        service = self.current()
        pools = set(principal.visible(self.pools)) if principal.scoped else None
        sessions = sorted(service.workers_in(pools), key=lambda session: session.id)
        return pb.ListWorkersResponse(workers=[convert.worker_info(session) for session in sessions])

    @_api_errors
    async def list_recurring(self, principal: Principal, request: pb.Empty | None = None) -> pb.ListRecurringResponse:
        principal.require(Role.METRICS)
        infos = await self.current().list_recurring()
        return pb.ListRecurringResponse(
            schedules=[convert.recurring_info(info) for info in infos if principal.sees(info.pool)]
        )

    # ------------------------------------------------------------------------------- Console

    @_api_errors
    async def list_shards(self, principal: Principal, request: pb.Empty | None = None) -> cpb.ListShardsResponse:
        """This shard as its leader (this server) describes itself (metrics role); a pool-scoped
        caller is told only of its own pools."""
        principal.require(Role.METRICS)
        service = self.current()
        local = self.config.local_shard()
        info = cpb.ShardInfo(
            leader=self.address,
            host=socket.gethostname(),
            pid=os.getpid(),
            epoch=service.driver.epoch,
            leading_since_unix_ns=self._leading_since,
            version=__version__,
            store=self.config.store.kind,
            pools=principal.visible(self.pools),
        )
        if local is not None:
            info.name, info.number, info.endpoint = local.name, local.number, local.endpoint
            for pool, placement in sorted(self.topology.placements().items()):
                if principal.sees(pool):
                    info.placements.add(pool=pool, shard=placement.shard, version=placement.version)
                    info.topology_version = max(info.topology_version, placement.version)
            info.topology_differences.extend(
                note for pool, note in sorted(self.topology.differences.items()) if principal.sees(pool)
            )
        return cpb.ListShardsResponse(shards=[info])

    def describe_replica(self, principal: Principal) -> cpb.ReplicaInfo:
        """This process as one replica of its shard (metrics role): whether it leads now."""
        principal.require(Role.METRICS)
        return cpb.ReplicaInfo(
            state="leader" if self.serving else "standby",
            host=socket.gethostname(),
            pid=os.getpid(),
            version=__version__,
        )

    @_api_errors
    async def list_schedules(self, principal: Principal, request: pb.Empty | None = None) -> cpb.ListSchedulesResponse:
        """The schedules the caller may see, with what ``ListRecurring`` cannot say (metrics role)."""
        principal.require(Role.METRICS)
        now = self.clock()
        infos = await self.current().list_recurring()
        return cpb.ListSchedulesResponse(
            schedules=[_schedule(info, now) for info in infos if principal.sees(info.pool)]
        )

    @_api_errors
    async def pause_schedule(self, principal: Principal, request: cpb.ScheduleRequest) -> cpb.ScheduleResponse:
        return await self._switch_schedule(principal, request, paused=True)

    @_api_errors
    async def resume_schedule(self, principal: Principal, request: cpb.ScheduleRequest) -> cpb.ScheduleResponse:
        return await self._switch_schedule(principal, request, paused=False)

    # ------------------------------------------------------------------------------- pool moves

    def _moves(self) -> PoolMoves:
        if self.moves is None:
            raise ApiError(
                Code.FAILED_PRECONDITION,
                "pools move between the shards of a sharded cluster on SQLite or Postgres only",
            )
        return self.moves

    def _move_status(self, pool: str, move: MoveRow | None) -> cpb.MoveStatus:
        local = self.config.local_shard()
        placement = self.topology.placement(pool)
        status = cpb.MoveStatus(
            pool=pool,
            shard=local.name if local is not None else "",
            placement_version=placement.version if placement is not None else 0,
        )
        if move is not None:
            status.move_id, status.target, status.version = move.move_id, move.target, move.version
            status.phase, status.message, status.updated_unix_ns = move.phase, move.message, move.updated_at
        return status

    @_api_errors
    async def move_pool(self, principal: Principal, request: cpb.MovePoolRequest) -> cpb.MoveStatus:
        """Record a move of a pool this shard serves and drain the pool; the next leadership
        carries it out (docs/pool-moves.md). Admin role; a scoped admin only for pools in its scope."""
        principal.require(Role.ADMIN)
        pool = convert.text(request.pool, "pool", MAX_NAME_LEN)
        self.check_pool(principal, pool)  # in scope, known, and served here (or: which shard serves it)
        target = convert.text(request.to, "to", MAX_NAME_LEN)
        moves = self._moves()
        local = self.config.local_shard()
        assert local is not None
        if target not in {shard.name for shard in self.config.shards}:
            raise ApiError.invalid(f"to: no shard is named {target!r}")
        if target == local.name:
            raise ApiError.invalid(f"to: pool {pool!r} is already served by shard {target!r}")
        if self.pools == (pool,):
            raise ApiError(
                Code.FAILED_PRECONDITION,
                f"pool {pool!r} is the last pool of shard {local.name!r}; a shard runs at least one pool",
            )
        service = self.current()
        placement = self.topology.placement(pool)
        version = (placement.version if placement is not None else 1) + 1
        move, new = await moves.request(service.driver.epoch or 0, pool, target, version)
        if new:
            self.drain(move, True)
        return self._move_status(pool, move)

    @_api_errors
    async def get_move(self, principal: Principal, request: cpb.MoveRequest) -> cpb.MoveStatus:
        """Where a pool is and this shard's latest move of it (metrics role)."""
        principal.require(Role.METRICS)
        pool = convert.text(request.pool, "pool", MAX_NAME_LEN)
        self.check_pool(principal, pool)
        self.current()
        return self._move_status(pool, await self._moves().latest(pool))

    @_api_errors
    async def abort_move(self, principal: Principal, request: cpb.MoveRequest) -> cpb.MoveStatus:
        """Abandon a pool's move while nothing of it has reached the target (admin role); otherwise
        FAILED_PRECONDITION naming the move's phase and what to do instead."""
        principal.require(Role.ADMIN)
        pool = convert.text(request.pool, "pool", MAX_NAME_LEN)
        self.check_pool(principal, pool)
        service = self.current()
        moves = self._moves()
        move = await moves.latest(pool)
        if move is None:
            raise ApiError(Code.FAILED_PRECONDITION, f"pool {pool!r} has no move to abort on this shard")
        if move.phase in ABORTABLE and await moves.abort(service.driver.epoch or 0, move):
            self.drain(move, False)
            return self._move_status(pool, await moves.latest(pool))
        local = self.config.local_shard()
        now = await moves.latest(pool) or move
        raise ApiError(Code.FAILED_PRECONDITION, _cannot_abort(now, local.name if local is not None else ""))

    async def _switch_schedule(
        self, principal: Principal, request: cpb.ScheduleRequest, *, paused: bool
    ) -> cpb.ScheduleResponse:
        principal.require(Role.ADMIN)
        name = convert.text(request.name, "name")
        service = self.current()
        if principal.scoped:
            infos = {info.name: info for info in await service.list_recurring()}
            info = infos.get(name)
            if info is None or not principal.sees(info.pool):
                return cpb.ScheduleResponse(found=False)
        return cpb.ScheduleResponse(found=await service.pause_recurring(name, paused))


def _cannot_abort(move: MoveRow, source: str) -> str:
    """Why ``move`` cannot be aborted in its phase, and what to do instead."""
    what = f"the move of pool {move.pool!r} to shard {move.target!r} is {move.phase!r}"
    if move.phase == "transferring":
        return (
            f"{what}: the target may own the pool already, so it cannot be aborted; it finishes at this "
            f"shard's next leadership; then move it back with `cronoq admin move-pool {move.pool} --to "
            f"{source}`"
        )
    if move.phase == "done":
        return f"{what}: move it back with `cronoq admin move-pool {move.pool} --to {source}`"
    return f"{what}: it is over, there is nothing to abort"


def _schedule(info: RecurringInfo, now: int) -> cpb.Schedule:
    """A schedule for the console: its ``RecurringInfo``, paused state, key and next starts."""
    out = cpb.Schedule(info=convert.recurring_info(info), paused=info.paused, key=info.key or "")
    if info.next_at is not None and info.armed:
        try:
            cron = CronSchedule.parse(info.cron, info.tz)
        except ConfigError:
            return out
        start = info.next_at
        while len(out.next_runs_unix_ns) < NEXT_RUNS:
            out.next_runs_unix_ns.append(start)
            start = cron.next_after(max(start, now))
    return out


def _visible_part(snap: Snapshot, principal: Principal) -> Snapshot:
    """``snap`` as a pool-scoped caller may see it: its pools only, and counts and totals summed
    over them (never the shard's, which would tell it about other pools' work)."""
    pools = [pool for pool in snap.pools if principal.sees(pool.name)]
    totals = dict.fromkeys(snap.totals, 0)
    for pool in pools:
        for name, count in pool.totals.items():
            totals[name] = totals.get(name, 0) + count
    running = sum(pool.busy for pool in pools)
    pending = sum(pool.pending for pool in pools)
    return Snapshot(pools, running + pending, running, pending, totals)


async def _events(subscription: Subscription) -> AsyncGenerator[pb.StatusEvent, None]:
    try:
        while True:
            try:
                event = await subscription.next()
            except Exception as exc:
                raise from_exception(exc) from exc
            yield convert.status_event(event)
    finally:
        subscription.close()
