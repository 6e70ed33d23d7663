"""The ``cronoq.console.v1.Console`` gRPC service, beside the ``cronoq.v1`` ones.

Its calls go through the same authentication, bounds and router as every unary call of
``GrpcServices`` (whose ``_unary`` they use), so they are forwarded between shards alike.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc

from cronoq.proto import console_pb2 as cpb
from cronoq.proto import console_pb2_grpc as cpbg
from cronoq.proto import cronoq_pb2 as pb
from cronoq.router import Router

from .errors import from_exception

if TYPE_CHECKING:
    from .grpc_service import GrpcServices

__all__ = ["ConsoleServicer"]


def _routed(router_method: str) -> Callable[[ConsoleServicer, Any, Any], Awaitable[Any]]:
    """A Console method that runs its call as every unary call runs, through ``Router.<router_method>``."""
    if not callable(getattr(Router, router_method, None)):
        raise AttributeError(f"Router has no method {router_method!r}")

    async def method(self: ConsoleServicer, request: Any, context: Any) -> Any:
        services = self._services
        return await services.run_unary(context, request, getattr(services.router, router_method))

    return method


class ConsoleServicer(cpbg.ConsoleServicer):
    def __init__(self, services: GrpcServices) -> None:
        self._services = services

    def add_to(self, server: grpc.aio.Server) -> None:
        from .grpc_service import register_services

        register_services(server, cpb, self, tuple(cpb.DESCRIPTOR.services_by_name))

    # Every method but DescribeReplica: its Router method, which may forward it to another shard.
    SearchTasks = _routed("search_tasks")
    GetTaskDetail = _routed("task_detail")
    ListShards = _routed("list_shards")
    ListSchedules = _routed("list_schedules")
    PauseSchedule = _routed("pause_schedule")
    ResumeSchedule = _routed("resume_schedule")
    MovePool = _routed("move_pool")
    GetMove = _routed("get_move")
    AbortMove = _routed("abort_move")

    async def DescribeReplica(self, request: pb.Empty, context: Any) -> cpb.ReplicaInfo:
        """This process, leader or standby (a standby answers this one call): never forwarded."""
        from .grpc_service import Malformed, cert_names, metadata_value
        from .work_stream import abort_call

        services = self._services
        try:
            if isinstance(request, Malformed):
                raise request.error()
            principal = services.auth.authenticate(metadata_value(context, "authorization"), cert_names(context))
            return services.api.describe_replica(principal)
        except Exception as exc:
            return await abort_call(context, from_exception(exc))  # type: ignore[no-any-return]
