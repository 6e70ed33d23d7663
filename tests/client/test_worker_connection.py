"""Worker connection handling: reconnects, backoff, fatal codes, Shutdown, shard redirects."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import grpc
import pytest

from cronoq.client import ClientError, Lease, Worker
from cronoq.proto import cronoq_pb2 as pb
from tests.client.conftest import TOKEN
from tests.client.fake_server import FakeCronoq, WorkStream, eventually, start_server

ENDPOINT_KEY = "cronoq-shard-endpoint"


async def ok(lease: Lease) -> str:
    return "ok"


def refuse(*codes: tuple[grpc.StatusCode, str], endpoint: Any = None) -> Any:
    """An on_register hook failing the first len(codes) registrations with these statuses."""
    pending = list(codes)

    async def hook(stream: WorkStream, context: Any) -> None:
        if pending:
            code, details = pending.pop(0)
            trailing = ((ENDPOINT_KEY, endpoint(stream) if callable(endpoint) else endpoint),) if endpoint else ()
            await context.abort(code, details, trailing_metadata=trailing)

    return hook


def dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_shutdown_not_leader_reconnects(fake: FakeCronoq, start_worker: Any) -> None:
    running = start_worker(fake.address, ok, backoff=(0.01, 1.0))
    await running.worker.wait_registered(timeout=5)
    fake.streams[0].send(shutdown=pb.Shutdown(reason="", not_leader=True))
    await eventually(lambda: len(fake.streams) == 2 and fake.streams[1].register is not None, what="reconnect")
    await running.worker.wait_registered(timeout=5)
    assert running.worker.last_shutdown == "shutdown"
    assert running.worker.connections == 2 and running.worker.worker_id == 2
    fake.streams[1].send(shutdown=pb.Shutdown(reason="draining"))
    await eventually(lambda: len(fake.streams) == 3, what="second reconnect")
    assert running.worker.last_shutdown == "draining"
    await running.stop()


async def test_stream_end_without_reconnect_raises_unavailable(fake: FakeCronoq, start_worker: Any) -> None:
    running = start_worker(fake.address, ok, reconnect=False)
    await running.worker.wait_registered(timeout=5)
    fake.streams[0].send(shutdown=pb.Shutdown(reason="bye"))
    with pytest.raises(ClientError) as err:
        await asyncio.wait_for(running.task, 5)
    assert err.value.code == "unavailable"
    assert len(fake.streams) == 1


async def test_error_without_reconnect_raises(fake: FakeCronoq, start_worker: Any) -> None:
    fake.on_register = refuse((grpc.StatusCode.UNAVAILABLE, "not leader"))
    running = start_worker(fake.address, ok, reconnect=False)
    with pytest.raises(ClientError) as err:
        await asyncio.wait_for(running.task, 5)
    assert (err.value.code, err.value.message) == ("unavailable", "not leader")


@pytest.mark.parametrize(
    "code",
    [
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.UNIMPLEMENTED,
    ],
)
async def test_fatal_codes_are_raised(fake: FakeCronoq, start_worker: Any, code: grpc.StatusCode) -> None:
    fake.on_register = refuse((code, "no"))
    running = start_worker(fake.address, ok)
    with pytest.raises(ClientError) as err:
        await asyncio.wait_for(running.task, 5)
    assert (err.value.code, err.value.message) == (code.name.lower(), "no")
    assert running.worker.connections == 1


async def test_transient_errors_are_retried_with_backoff(fake: FakeCronoq, start_worker: Any) -> None:
    fake.on_register = refuse(
        (grpc.StatusCode.UNAVAILABLE, "not leader"),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "too many workers"),
        (grpc.StatusCode.INTERNAL, "oops"),
    )
    running = start_worker(fake.address, ok, backoff=(0.02, 0.04))
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await running.worker.wait_registered(timeout=5)
    # Waits of 0.02, 0.04 (doubled) and 0.04 (capped) came before the fourth attempt.
    assert loop.time() - t0 >= 0.1 - 0.01
    assert running.worker.connections == 4
    await running.stop()


async def test_unreachable_server_is_retried_until_it_appears(start_worker: Any) -> None:
    port = dead_port()
    running = start_worker(f"127.0.0.1:{port}", ok, backoff=(0.01, 0.02))
    await eventually(lambda: running.worker.connections >= 2, what="retries")
    servicer = FakeCronoq()
    server = grpc.aio.server()
    from tests.client.fake_server import pb_grpc

    pb_grpc.add_WorkersServicer_to_server(servicer, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    try:
        await running.worker.wait_registered(timeout=10)
        await running.stop()
    finally:
        await server.stop(0)


async def test_stop_interrupts_backoff(start_worker: Any) -> None:
    running = start_worker(f"127.0.0.1:{dead_port()}", ok, backoff=(30.0, 60.0))
    # A spy on the worker's pause between attempts (the real pause still runs).
    pausing = asyncio.Event()
    pause = running.worker._pause

    async def spied_pause(delay: float) -> None:
        pausing.set()
        await pause(delay)

    running.worker._pause = spied_pause  # type: ignore[method-assign]
    await asyncio.wait_for(pausing.wait(), 10)  # the first attempt failed: the worker backs off
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await running.stop()
    assert loop.time() - t0 < 5


async def test_redirect_is_followed(fake: FakeCronoq, other: FakeCronoq, start_worker: Any) -> None:
    fake.on_register = refuse(
        (grpc.StatusCode.FAILED_PRECONDITION, "pool lives elsewhere"), endpoint=f"http://{other.address}"
    )
    running = start_worker(fake.address, ok, pool="gpu", options=[("grpc.default_authority", "cronoq.internal")])
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await running.worker.wait_registered(timeout=5)
    assert loop.time() - t0 < 1.0  # no backoff wait before following
    assert len(fake.streams) == 1 and len(other.streams) == 1
    assert other.streams[0].register is not None and other.streams[0].register.pool == "gpu"
    assert running.worker.connections == 2
    other._admit(pb.TaskSpec(pool="gpu", payload=b"x"))
    await eventually(lambda: bool(other.streams[0].of_kind("complete")), what="work on the redirected shard")
    await running.stop()


async def test_redirect_with_token_to_loopback_http_is_allowed(
    fake: FakeCronoq, other: FakeCronoq, start_worker: Any
) -> None:
    fake.on_register = refuse((grpc.StatusCode.FAILED_PRECONDITION, "elsewhere"), endpoint=f"http://{other.address}/")
    running = start_worker(fake.address, ok, token=TOKEN)
    await running.worker.wait_registered(timeout=5)
    assert other.streams[0].metadata["authorization"] == f"Bearer {TOKEN}"
    await running.stop()


async def test_redirect_with_token_to_remote_http_is_refused(fake: FakeCronoq, start_worker: Any) -> None:
    fake.on_register = refuse(
        (grpc.StatusCode.FAILED_PRECONDITION, "elsewhere"), endpoint="http://shard-2.example.invalid:7070"
    )
    running = start_worker(fake.address, ok, token=TOKEN)
    with pytest.raises(ClientError) as err:
        await asyncio.wait_for(running.task, 5)
    assert err.value.code == "failed_precondition"
    assert running.worker.connections == 1


async def test_redirect_to_bad_endpoint_is_refused(fake: FakeCronoq, start_worker: Any) -> None:
    fake.on_register = refuse((grpc.StatusCode.FAILED_PRECONDITION, "elsewhere"), endpoint="shard-2:7070")
    running = start_worker(fake.address, ok)
    with pytest.raises(ClientError) as err:
        await asyncio.wait_for(running.task, 5)
    assert err.value.code == "failed_precondition"


async def test_redirect_loop_stops_after_max(fake: FakeCronoq, start_worker: Any) -> None:
    loop_forever = [(grpc.StatusCode.FAILED_PRECONDITION, "elsewhere")] * 10
    fake.on_register = refuse(*loop_forever, endpoint=lambda _s: f"http://{fake.address}")
    running = start_worker(fake.address, ok)
    with pytest.raises(ClientError) as err:
        await asyncio.wait_for(running.task, 5)
    assert err.value.code == "failed_precondition"
    assert len(fake.streams) == 4  # the first attempt and three followed redirects


async def test_redirect_counter_resets_after_a_clean_session(
    fake: FakeCronoq, other: FakeCronoq, start_worker: Any
) -> None:
    # Three redirects, a session that ends normally, then three more: never four in a row.
    hops = [(grpc.StatusCode.FAILED_PRECONDITION, "elsewhere")] * 3
    fake.on_register = refuse(*hops, endpoint=lambda _s: f"http://{fake.address}")
    running = start_worker(fake.address, ok, backoff=(0.01, 0.02))
    await running.worker.wait_registered(timeout=5)
    assert len(fake.streams) == 4
    fake.on_register = refuse(*hops, endpoint=lambda _s: f"http://{fake.address}")
    fake.streams[-1].send(shutdown=pb.Shutdown(reason="moving"))
    await eventually(lambda: len(fake.streams) == 8 and fake.streams[-1].register is not None, what="re-register")
    await running.worker.wait_registered(timeout=5)
    await running.stop()


async def test_unavailable_redirect_target_falls_back_to_original(fake: FakeCronoq, start_worker: Any) -> None:
    fake.on_register = refuse(
        (grpc.StatusCode.FAILED_PRECONDITION, "elsewhere"), endpoint=f"http://127.0.0.1:{dead_port()}"
    )
    running = start_worker(fake.address, ok, backoff=(0.01, 0.02))
    await running.worker.wait_registered(timeout=10)
    # original (redirected away) → dead shard (UNAVAILABLE) → original again
    assert len(fake.streams) == 2
    assert running.worker.connections == 3
    await running.stop()


async def test_stop_before_registration(fake: FakeCronoq, start_worker: Any) -> None:
    gate = asyncio.Event()

    async def hold(stream: WorkStream, context: Any) -> None:
        await gate.wait()

    fake.on_register = hold
    running = start_worker(fake.address, ok)
    await eventually(lambda: len(fake.streams) == 1 and fake.streams[0].register is not None, what="register")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await running.stop()
    assert loop.time() - t0 < 2.0
    assert running.worker.worker_id is None
    gate.set()


async def test_run_twice_on_the_same_loop(fake: FakeCronoq) -> None:
    worker = Worker(fake.address, "default", ok, backoff=(0.01, 0.02))
    for round_ in (1, 2):
        task = asyncio.create_task(worker.run())
        await worker.wait_registered(timeout=5)
        assert worker.worker_id == round_
        with pytest.raises(RuntimeError):
            await worker.run()
        await worker.stop()
        await asyncio.wait_for(task, 5)
    assert worker.connections == 2


def test_run_again_on_another_loop() -> None:
    worker = Worker("127.0.0.1:1", "default", ok, backoff=(0.01, 0.02))

    async def session() -> int | None:
        servicer = FakeCronoq()
        server = await start_server(servicer)
        worker.target = servicer.address
        try:
            task = asyncio.create_task(worker.run())
            await worker.wait_registered(timeout=5)
            servicer._admit(pb.TaskSpec(pool="default"))
            await eventually(lambda: bool(servicer.streams[0].of_kind("complete")), what="completion")
            await worker.stop()
            await asyncio.wait_for(task, 5)
            return worker.worker_id
        finally:
            await server.stop(0)

    assert asyncio.run(session()) == 1
    assert asyncio.run(session()) == 1
    assert worker.connections == 2


def test_the_link_argument_of_earlier_versions_is_ignored_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match="link"):
        Worker("127.0.0.1:1", "default", ok, link=False)
