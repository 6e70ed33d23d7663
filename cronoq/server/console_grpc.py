"""The ``cronoq.console.v1.Console`` gRPC service, beside the ``cronoq.v1`` ones.

Its calls go through the same authentication, bounds and router as every unary call of
``GrpcServices`` (whose ``_unary`` they use), so they are forwarded between shards alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc

from cronoq.proto import console_pb2 as cpb
from cronoq.proto import console_pb2_grpc as cpbg
from cronoq.proto import cronoq_pb2 as pb

from .errors import from_exception

if TYPE_CHECKING:
    from .grpc_service import GrpcServices

__all__ = ["ConsoleServicer"]


class ConsoleServicer(cpbg.ConsoleServicer):
    def __init__(self, services: GrpcServices) -> None:
        self._services = services

    def add_to(self, server: grpc.aio.Server) -> None:
        from .grpc_service import register_services

        register_services(server, cpb, self, tuple(cpb.DESCRIPTOR.services_by_name))

    async def SearchTasks(self, request: cpb.SearchTasksRequest, context: Any) -> pb.ListTasksResponse:
        services = self._services
        return await services.run_unary(context, request, services.router.search_tasks)

    async def GetTaskDetail(self, request: pb.GetRequest, context: Any) -> cpb.TaskDetail:
        services = self._services
        return await services.run_unary(context, request, services.router.task_detail)

    async def ListShards(self, request: pb.Empty, context: Any) -> cpb.ListShardsResponse:
        services = self._services
        return await services.run_unary(context, request, services.router.list_shards)

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

    async def ListSchedules(self, request: pb.Empty, context: Any) -> cpb.ListSchedulesResponse:
        services = self._services
        return await services.run_unary(context, request, services.router.list_schedules)

    async def PauseSchedule(self, request: cpb.ScheduleRequest, context: Any) -> cpb.ScheduleResponse:
        services = self._services
        return await services.run_unary(context, request, services.router.pause_schedule)

    async def ResumeSchedule(self, request: cpb.ScheduleRequest, context: Any) -> cpb.ScheduleResponse:
        services = self._services
        return await services.run_unary(context, request, services.router.resume_schedule)
