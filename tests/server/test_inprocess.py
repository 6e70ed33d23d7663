"""The server's layers in one process: the app on port 0, conversions, auth, metrics text."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator

import grpc
import pytest
from cronoq.config import Config, Role
from cronoq.engine import OverflowPolicy, SubmitCode, UnknownDependencyPolicy, UnknownTask
from cronoq.engine.types import NS_PER_S, AdmissionError
from cronoq.shard.driver import NotLeader
from cronoq.shard.service import DataLoss, WaitTimeout

from cronoq.client import Client, ClientError, Lease, Worker
from cronoq.proto import cronoq_pb2 as pb
from cronoq.proto import cronoq_pb2_grpc as pbg
from cronoq.server import work_stream
from cronoq.server.app import Listening, ServerApp
from cronoq.server.auth import Authenticator
from cronoq.server.convert import core_config, recurring_spec, task_spec
from cronoq.server.errors import ApiError, Code, from_exception

from ..waiting import eventually

TOKEN = "inprocess-admin-token-0123456789"


@pytest.fixture
async def app() -> AsyncIterator[tuple[ServerApp, str]]:
    config = Config.parse(f"""
[server]
grpc_addr = "127.0.0.1:0"
http_addr = "127.0.0.1:0"
shutdown_grace_s = 0.5

[[auth.tokens]]
token = "{TOKEN}"
role = "admin"

[[pools]]
name = "default"
lease_ttl_s = 5
""")
    listening: asyncio.Queue[Listening] = asyncio.Queue()
    server = ServerApp(config, on_listening=listening.put_nowait)
    running = asyncio.ensure_future(server.run())
    while (event := await asyncio.wait_for(listening.get(), 10)).role != "leader":
        pass
    try:
        yield server, event.grpc
    finally:
        server.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(running, 10)


async def test_a_silent_work_stream_ends_with_deadline_exceeded(
    app: tuple[ServerApp, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(work_stream, "REGISTER_TIMEOUT_S", 0.3)
    _, address = app

    async def nothing() -> AsyncIterator[pb.WorkerMessage]:
        await asyncio.sleep(30)
        yield pb.WorkerMessage()

    async with grpc.aio.insecure_channel(address) as channel:
        call = pbg.WorkersStub(channel).Work(nothing(), metadata=(("authorization", f"Bearer {TOKEN}"),))
        assert await asyncio.wait_for(call.code(), 10) == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_graceful_stop_lets_running_attempts_finish_then_sends_shutdown(app: tuple[ServerApp, str]) -> None:
    server, address = app
    release = asyncio.Event()

    async def slow(lease: Lease) -> bytes:
        await release.wait()
        return b"finished"

    worker = Worker(address, "default", slow, token=TOKEN, reconnect=False)
    run = asyncio.ensure_future(worker.run())
    await worker.wait_registered(5)
    async with Client(address, token=TOKEN) as client:
        submitted = await client.submit(b"")
        await eventually(lambda: worker.running == 1)
        waiting = asyncio.ensure_future(client.wait(submitted.id, timeout=5))
        events: list[str] = []

        async def watch() -> None:
            async for event in client.watch():
                events.append(event.status)

        watching = asyncio.ensure_future(watch())
        service = server.service
        assert service is not None
        # The wait and the watch are attached before the stop begins.
        await eventually(lambda: submitted.id in service._waiters and service._subscriptions)
        server.stop()
        await eventually(lambda: not service.leading)
        with pytest.raises(ClientError) as refused:
            await client.submit(b"")
        assert refused.value.code == "unavailable"
        release.set()
        result = await waiting
        assert result.status == "succeeded" and result.output == b"finished"
        with pytest.raises(ClientError) as ended:
            await asyncio.wait_for(watching, 10)
        assert ended.value.code == "unavailable" and events == ["succeeded"]
    with contextlib.suppress(Exception):
        await asyncio.wait_for(run, 10)
    assert worker.last_shutdown == "shutting down"


async def test_metrics_text_names_the_published_series(app: tuple[ServerApp, str]) -> None:
    server, address = app

    async def ok(lease: Lease) -> bytes:
        return b""

    worker = Worker(address, "default", ok, token=TOKEN)
    run = asyncio.ensure_future(worker.run())
    await worker.wait_registered(5)
    async with Client(address, token=TOKEN) as client:
        await client.submit(b"", wait=True)
    principal = Authenticator(server.config.auth).authenticate(f"Bearer {TOKEN}")
    body, content_type = await server.api.metrics_text(principal)
    text = body.decode()
    assert content_type.startswith("text/plain; version=0.0.4")
    for line in (
        'cronoq_pool_desired_workers{pool="default"}',
        'cronoq_pool_workers{pool="default"} 1.0',
        "cronoq_workers_connected 1.0",
        'cronoq_tasks_total{status="succeeded"} 1.0',
        "cronoq_stale_completions_total 0.0",
        'cronoq_pool_cost_total{pool="default"} 0.0',
        'cronoq_pool_capacity{pool="default"} 1.0',
        'cronoq_pool_pending_by_class{class="critical",pool="default"} 0.0',
    ):
        assert line in text, line
    await worker.stop(1)
    await run


def test_core_config_from_the_server_configuration() -> None:
    config = Config.parse("""
[limits]
max_pending_total = 500
max_pending_per_pool = 50
key_retention_s = 120
key_retention_max = 7

[[pools]]
name = "a"
min = 2
max = 8
lease_ttl_s = 12
overflow = "shed_lowest"
retry = { max_attempts = 5, initial_backoff_s = 2, max_backoff_s = 30 }
await_unknown_dependencies_s = 9
reservable_fraction = 0.25
target_utilization = 0.5
tenant_weights = { x = 2.0 }

[[pools]]
name = "b"
max_pending = 3
autoscale = false

[[resources]]
kind = "token_bucket"
name = "api"
rate = 5
burst = 10
""")
    core = core_config(config)
    a, b = core.pools
    assert (a.name, a.min_workers, a.max_workers, a.initial_workers, a.lease_ttl) == ("a", 2, 8, 0, 12 * NS_PER_S)
    assert a.bounds.max_pending == 50 and a.overflow is OverflowPolicy.SHED_LOWEST
    assert (a.retry.max_attempts, a.retry.initial_backoff, a.retry.max_backoff) == (5, 2 * NS_PER_S, 30 * NS_PER_S)
    assert a.unknown_dependency is UnknownDependencyPolicy.AWAIT and a.await_timeout == 9 * NS_PER_S
    assert a.reservable_fraction == 0.25 and a.autoscale is not None and a.autoscale.target_utilization == 0.5
    assert a.fairness is not None and a.fairness.weight("x") == 2.0
    assert b.bounds.max_pending == 3 and b.autoscale is None and b.lease_ttl == 30 * NS_PER_S
    assert core.global_bounds.max_pending == 500
    assert (core.retention, core.retention_max) == (120 * NS_PER_S, 7)
    assert core.resources[0].name == "api" and core.resources[0].capacity == 10
    core.validate()


def test_task_spec_conversion() -> None:
    limits = Config.default().limits
    now = 1_000 * NS_PER_S
    message = pb.TaskSpec(
        payload=b"x",
        content_type="text/plain",
        deadline_in_s=2.5,
        start_unix_ns=5 * NS_PER_S,
        tolerance_s=0,
        on_miss=pb.MISS_POLICY_SKIP,
        priority=pb.PRIORITY_LOW,
        deps=[pb.Dep(target=pb.TaskRef(key="p"), cond=pb.EDGE_COND_ON_FAILURE)],
    )
    message.retry.CopyFrom(pb.RetryPolicy(max_attempts=0, initial_backoff_s=3, multiplier=0, max_backoff_s=0))
    spec = task_spec(message, now, limits)
    assert spec.pool is None and spec.kind == "default" and spec.key is None and spec.tenant is None
    assert spec.deadline == now + round(2.5 * NS_PER_S)
    assert spec.fixed_start is not None and spec.fixed_start.start == 5 * NS_PER_S and spec.fixed_start.tolerance == 0
    assert spec.fixed_start.on_miss.value == "skip" and spec.priority.label == "low"
    assert spec.deps[0].target == "p" and spec.deps[0].cond.value == "on_failure"
    assert spec.retry is not None and spec.retry.max_attempts == 3 and spec.retry.multiplier == 2.0
    assert spec.retry.max_backoff == 60 * NS_PER_S
    for bad in (pb.TaskSpec(timeout_s=math.nan), pb.TaskSpec(deadline_in_s=-0.5), pb.TaskSpec(on_miss=7)):
        with pytest.raises(ApiError) as err:
            task_spec(bad, now, limits)
        assert err.value.code is Code.INVALID_ARGUMENT

    template = pb.RecurringRequest(name="r", cron="* * * * *", template=pb.TaskSpec(key="k", deadline_in_s=30))
    recurring = recurring_spec(template, limits)
    assert recurring.deadline_after == 30 * NS_PER_S and recurring.tz is None and recurring.template.key == "k"
    for field in ({"deadline_unix_ns": 1}, {"start_in_s": 1.0}, {"start_unix_ns": 1}):
        with pytest.raises(ApiError):
            recurring_spec(pb.RecurringRequest(name="r", cron="* * * * *", template=pb.TaskSpec(**field)), limits)


def test_authentication() -> None:
    config = Config.parse(f"""
[[auth.tokens]]
token = "{TOKEN}"
role = "worker"
pools = ["default"]
labels = ["gpu=a100"]
""")
    auth = Authenticator(config.auth)
    principal = auth.authenticate(f"bearer   {TOKEN} ")
    assert principal.role is Role.WORKER and principal.pools == frozenset({"default"})
    assert principal.sees("default") and not principal.sees("other")
    principal.check_labels({"gpu": "a100"})
    with pytest.raises(ApiError) as label:
        principal.check_labels({"gpu": "h100"})
    assert label.value.code is Code.PERMISSION_DENIED
    with pytest.raises(ApiError) as role:
        principal.require(Role.CLIENT)
    assert role.value.code is Code.PERMISSION_DENIED
    for header in (None, "", "Basic abc", f"Bearer {TOKEN}x", "Bearer"):
        with pytest.raises(ApiError) as err:
            auth.authenticate(header)
        assert err.value.code is Code.UNAUTHENTICATED
    assert Authenticator(Config.default().auth).authenticate(None).role is Role.ADMIN


def test_error_mapping() -> None:
    expected = {
        SubmitCode.UNKNOWN_POOL: (grpc.StatusCode.NOT_FOUND, 404),
        SubmitCode.UNKNOWN_DEPENDENCY: (grpc.StatusCode.NOT_FOUND, 404),
        SubmitCode.RESERVATION_CONFLICT: (grpc.StatusCode.FAILED_PRECONDITION, 409),
        SubmitCode.FULL: (grpc.StatusCode.RESOURCE_EXHAUSTED, 429),
        SubmitCode.OVERLOADED: (grpc.StatusCode.RESOURCE_EXHAUSTED, 429),
        SubmitCode.CYCLE: (grpc.StatusCode.INVALID_ARGUMENT, 400),
        SubmitCode.INVALID: (grpc.StatusCode.INVALID_ARGUMENT, 400),
        SubmitCode.RESOURCE_EXCEEDS_CAPACITY: (grpc.StatusCode.INVALID_ARGUMENT, 400),
    }
    for code, (status, http) in expected.items():
        error = from_exception(AdmissionError(code, "x", 2))
        assert (error.code.grpc, error.code.http) == (status, http)
        assert error.message == "task 2: x"
    assert from_exception(DataLoss("slow")).code.grpc == grpc.StatusCode.DATA_LOSS
    assert from_exception(WaitTimeout("still running")).code.grpc == grpc.StatusCode.DEADLINE_EXCEEDED
    assert from_exception(UnknownTask("x")).code.grpc == grpc.StatusCode.NOT_FOUND
    unavailable = from_exception(NotLeader("gone"))
    assert unavailable.code.http == 503 and unavailable.message == "not the leader (standby or shutting down)"
    assert ApiError(Code.RESOURCE_EXHAUSTED, "full").http_body() == {"error": "full", "code": "too_many_requests"}


async def test_a_pool_of_another_shard_is_forwarded_and_its_workers_are_sent_there() -> None:
    config = Config.parse("""
[server]
grpc_addr = "127.0.0.1:0"
http_addr = "127.0.0.1:0"
shard = "one"

[[pools]]
name = "here"

[[pools]]
name = "there"

[[shards]]
name = "one"
number = 1
pools = ["here"]
endpoint = "http://127.0.0.1:1"

[[shards]]
name = "two"
number = 2
pools = ["there"]
endpoint = "http://127.0.0.1:2"
""")
    listening: asyncio.Queue[Listening] = asyncio.Queue()
    server = ServerApp(config, on_listening=listening.put_nowait)
    running = asyncio.ensure_future(server.run())
    try:
        while (event := await asyncio.wait_for(listening.get(), 10)).role != "leader":
            pass
        async with grpc.aio.insecure_channel(event.grpc) as channel:
            tasks = pbg.TasksStub(channel)
            local = await tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="here")))
            assert local.id >> 56 == 1  # the shard number is in the top 8 bits of the id
            # Work for the other shard is forwarded; nothing listens at its endpoint here.
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="there")))
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "shard 'two' is unavailable" in (err.value.details() or "")
            # A worker for the other shard's pool is refused with the endpoint to use instead.
            work = pbg.WorkersStub(channel).Work()
            await work.write(pb.WorkerMessage(register=pb.Register(pool="there", slots=1, protocol_version=3)))
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await work.read()
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            trailing = dict(err.value.trailing_metadata() or ())
            assert trailing.get("cronoq-shard") == "two"
            assert trailing.get("cronoq-shard-endpoint") == "http://127.0.0.1:2"
    finally:
        server.stop()
        await asyncio.wait_for(running, 10)
