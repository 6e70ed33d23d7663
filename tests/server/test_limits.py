"""Issue 5's limits, each against a real ``cronoq-server`` process over real gRPC and HTTP:

- a unary call that outlives ``max_wait_s + request_timeout_s`` ends CANCELLED (gRPC) / 504 (HTTP);
- calls beyond ``max_concurrent_requests`` get RESOURCE_EXHAUSTED (gRPC) / 429 (HTTP), and so do a
  credential's calls beyond ``max_concurrent_requests_per_caller``, while other credentials are
  still served (both transports share the counts);
- a Watch whose reader stops reading ends with DATA_LOSS once the server's buffer is full;
- a pool with a ``webhook`` scaler POSTs its desired worker count to a real HTTP receiver.

A call is made to outlive its limits by submitting into a pool whose pending bound is reached
with ``overflow = "wait"``: admission then waits for space that never comes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc
from aiohttp import web

from cronoq.proto import cronoq_pb2 as pb
from cronoq.proto import cronoq_pb2_grpc as pbg
from tests.server.harness import ADMIN_TOKEN, CLIENT_TOKEN, TENANT_TOKEN
from tests.server.http_support import HttpServerProcess, process_config

CLIENT = (("authorization", f"Bearer {CLIENT_TOKEN}"),)
ADMIN = (("authorization", f"Bearer {ADMIN_TOKEN}"),)
HTTP_CLIENT = {"authorization": f"Bearer {CLIENT_TOKEN}"}

# How long a test may wait for an outcome before it is declared broken (never a pass criterion).
PATIENCE_S = 30.0


def config(limits: str = "", pools: str = "") -> str:
    full = '\n[[pools]]\nname = "full"\nmax_pending = 1\noverflow = "wait"\n'
    return process_config(limits, extra=full + pools)


@contextlib.asynccontextmanager
async def server_process(
    directory: Path,
    text: str,
    env: dict[str, str] | None = None,
) -> AsyncIterator[HttpServerProcess]:
    proc = HttpServerProcess(directory, text, name="limits", env=env)
    # Starting blocks on the child's output; a receiver in this event loop must keep running.
    await asyncio.to_thread(proc.start)
    try:
        yield proc
    finally:
        await asyncio.to_thread(proc.stop)


@contextlib.asynccontextmanager
async def tasks_stub(server: HttpServerProcess) -> AsyncIterator[pbg.TasksStub]:
    async with grpc.aio.insecure_channel(server.address) as channel:
        yield pbg.TasksStub(channel)


def task(pool: str) -> pb.TaskSpec:
    return pb.TaskSpec(pool=pool, payload=b"{}")


async def grpc_code(call: Any) -> grpc.StatusCode:
    try:
        await call
    except grpc.aio.AioRpcError as error:
        return error.code()
    return grpc.StatusCode.OK


async def http_json(http: aiohttp.ClientSession, method: str, url: str, **kwargs: Any) -> tuple[int, Any]:
    async with http.request(method, url, headers=HTTP_CLIENT, **kwargs) as response:
        return response.status, await response.json()


async def fill(stub: pbg.TasksStub, pool: str = "full") -> int:
    """Take the one pending place of ``pool`` (no worker serves it): the id of that task."""
    response = await stub.Submit(pb.SubmitRequest(task=task(pool)), metadata=CLIENT, timeout=PATIENCE_S)
    return int(response.id)


# ------------------------------------------------------------------------------ time limits


async def test_a_call_past_max_wait_plus_request_timeout_is_cancelled(tmp_path: Path) -> None:
    text = config(limits="max_wait_s = 0.4\nrequest_timeout_s = 0.4")
    async with server_process(tmp_path, text) as server, tasks_stub(server) as stub:
        await fill(stub)
        # Submit with wait: admission waits for space, so the call runs past both limits together.
        waiting = stub.Submit(pb.SubmitRequest(task=task("full"), wait=True), metadata=CLIENT, timeout=PATIENCE_S)
        try:
            await waiting
        except grpc.aio.AioRpcError as error:
            assert error.code() == grpc.StatusCode.CANCELLED, error
            assert "request timeout expired" in (error.details() or "")
        else:
            raise AssertionError("a submission that could not be admitted succeeded")
        # SubmitBatch has no wait of its own: the same bound applies.
        batch = stub.SubmitBatch(pb.SubmitBatchRequest(tasks=[task("full")]), metadata=CLIENT, timeout=PATIENCE_S)
        assert await grpc_code(batch) == grpc.StatusCode.CANCELLED

        async with aiohttp.ClientSession() as http:
            status, body = await http_json(
                http, "POST", f"{server.http_url}/v1/tasks", json={"pool": "full", "wait": True}
            )
            assert (status, body["code"]) == (504, "gateway_timeout"), body
            # The server still answers normally afterwards.
            status, body = await http_json(http, "GET", f"{server.http_url}/v1/tasks?pool=full")
            assert status == 200 and len(body["tasks"]) == 1, body


# ------------------------------------------------------------------------ concurrency limit


async def test_one_credential_cannot_take_every_request_slot(tmp_path: Path) -> None:
    """``max_concurrent_requests_per_caller``: gRPC and HTTP calls of one credential share its
    slots (one ``UnaryRunner``), and a flood of it leaves room for every other credential."""
    text = config(limits="max_concurrent_requests = 4\nmax_concurrent_requests_per_caller = 1")
    async with server_process(tmp_path, text) as server, tasks_stub(server) as stub, aiohttp.ClientSession() as http:
        url = server.http_url
        blocker = await fill(stub)

        # The client token's only slot is held by a gRPC Submit waiting for space ...
        async def hold_grpc() -> Any:
            try:
                return await stub.Submit(pb.SubmitRequest(task=task("full")), metadata=CLIENT, timeout=PATIENCE_S)
            except grpc.aio.AioRpcError as error:
                return error

        async def probe_http() -> tuple[int, Any] | None:
            status, body = await http_json(http, "GET", f"{url}/v1/tasks?pool=full")
            return None if status == 200 else (status, body)

        held, (status, body) = await hold_then_probe(hold_grpc, probe_http, _grpc_refusal)
        # ... so its HTTP requests are refused too, with a message saying whose limit it is ...
        assert (status, body["code"]) == (429, "too_many_requests")
        assert "for this credential" in body["error"]
        # ... while another credential is served at once, over either transport.
        other = (("authorization", f"Bearer {TENANT_TOKEN}"),)
        info = await stub.Get(pb.GetRequest(task=pb.TaskRef(id=blocker)), metadata=other, timeout=PATIENCE_S)
        assert info.id == blocker
        async with http.delete(f"{url}/v1/tasks/{blocker}", headers={"authorization": f"Bearer {ADMIN_TOKEN}"}) as r:
            assert (r.status, await r.json()) == (200, {"cancelled": True})
        admitted = await asyncio.wait_for(held, PATIENCE_S)
        assert isinstance(admitted, pb.SubmitResponse) and admitted.id > blocker, admitted
        assert await probe_http() is None  # the slot is free again


async def test_calls_beyond_max_concurrent_requests_are_refused(tmp_path: Path) -> None:
    """The server-wide limit counts gRPC and HTTP together, whoever the callers are."""
    text = config(limits="max_concurrent_requests = 2")
    async with (
        server_process(tmp_path, text) as server,
        tasks_stub(server) as stub,
        aiohttp.ClientSession() as http,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        url = server.http_url
        await fill(stub)
        admin = pbg.AdminStub(channel)

        # One slot is held over HTTP by the client token, the other over gRPC by a tenant's token ...
        async def hold_http() -> tuple[int, Any]:
            return await http_json(http, "POST", f"{url}/v1/tasks", json={"pool": "full"})

        async def hold_grpc() -> Any:
            tenant = (("authorization", f"Bearer {TENANT_TOKEN}"),)
            return await stub.Submit(pb.SubmitRequest(task=task("full")), metadata=tenant, timeout=PATIENCE_S)

        async def probe() -> grpc.aio.AioRpcError | None:
            try:
                await admin.Snapshot(pb.Empty(), metadata=ADMIN, timeout=PATIENCE_S)
            except grpc.aio.AioRpcError as error:
                return error
            return None

        holds, refused = await hold_all_then_probe([hold_http, hold_grpc], probe)
        # ... so a third credential is refused with the server-wide message.
        assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert refused.details() == "too many requests in flight; retry later"
        async with http.get(f"{url}/healthz") as health:
            assert health.status == 200  # probes are not counted
        # Calls that end give their slots back.
        for held in holds:
            held.cancel()
        await asyncio.gather(*holds, return_exceptions=True)
        for _ in range(100):
            if await probe() is None:
                break
            await asyncio.sleep(0.05)
        assert await probe() is None


async def hold_all_then_probe(
    holds: list[Callable[[], Awaitable[Any]]],
    probe: Callable[[], Awaitable[Any]],
) -> tuple[list[asyncio.Future[Any]], Any]:
    """Start requests that stay in flight, then ``probe`` until it is refused: ``(the held
    requests, the probe's refusal)``. A held request that ends (a probe took its slot for a
    moment) starts the round again."""
    for _ in range(100):
        started = [asyncio.ensure_future(hold()) for hold in holds]
        while not any(held.done() for held in started):
            refusal = await probe()
            if refusal is not None and not any(held.done() for held in started):
                return started, refusal
            await asyncio.sleep(0.01)
        for held in started:
            held.cancel()
        await asyncio.gather(*started, return_exceptions=True)
    raise AssertionError("the probe was never refused while the requests were held")


def _grpc_refusal(answer: Any) -> bool:
    return isinstance(answer, grpc.aio.AioRpcError) and answer.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def hold_then_probe(
    hold: Callable[[], Awaitable[Any]], probe: Callable[[], Awaitable[Any]], refused: Callable[[Any], bool]
) -> tuple[asyncio.Future[Any], Any]:
    """Start a request that stays in flight (``hold``), then ``probe`` until the probe is refused:
    ``(the held request, the probe's refusal)``.

    Probing while the held request is still on its way can get *that* request refused instead;
    it is then started again. A probe answered normally means the held one has not arrived yet."""
    for _ in range(100):
        held = asyncio.ensure_future(hold())
        while not held.done():
            refusal = await probe()
            if refusal is not None:
                assert not held.done(), f"both refused: {held.result()}"
                return held, refusal
            await asyncio.sleep(0.01)
        outcome = held.result()
        assert refused(outcome), f"the held request ended: {outcome}"
    raise AssertionError("the probe was never refused while a request was held")


# ------------------------------------------------------------------------------- slow watch


async def test_a_watch_that_stops_reading_ends_with_data_loss(tmp_path: Path) -> None:
    pools = '[[pools]]\nname = "watched"\nmax_pending = 200000\n'
    async with server_process(tmp_path, config(pools=pools)) as server, tasks_stub(server) as stub:
        watch = stub.Watch(pb.WatchRequest(pools=["watched"], all_transitions=True), metadata=CLIENT)
        await watch.initial_metadata()  # subscribed
        # Far more events than the server buffers (4096) plus what the transport holds, while
        # nobody reads the stream.
        batches, per_batch = 20, 1000
        for _ in range(batches):
            batch = pb.SubmitBatchRequest(tasks=[task("watched")] * per_batch)
            await stub.SubmitBatch(batch, metadata=CLIENT, timeout=PATIENCE_S)
        received = 0
        try:
            async for _event in watch:
                received += 1
        except grpc.aio.AioRpcError as error:
            assert error.code() == grpc.StatusCode.DATA_LOSS, error
            assert "fell too far behind" in (error.details() or "")
        else:
            raise AssertionError(f"the watch ended without an error after {received} events")
        # The events buffered before the cut were delivered; the rest were not.
        assert 4096 <= received < batches * per_batch


# ---------------------------------------------------------------------------- webhook scaler


@dataclass
class ScaleReceiver:
    """Records every POST of the webhook scaler."""

    port: int = 0
    posts: list[tuple[str | None, Any]] = field(default_factory=list)  # (authorization, JSON body)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.BaseRequest) -> web.Response:
        if request.method != "POST" or request.path != "/scale":
            return web.Response(status=404)
        self.posts.append((request.headers.get("Authorization"), json.loads(await request.read())))
        self.changed.set()
        return web.Response(status=204)

    async def until(self, wanted: Any) -> Any:
        async def poll() -> Any:
            while not (found := wanted()):
                self.changed.clear()
                await self.changed.wait()
            return found

        try:
            return await asyncio.wait_for(poll(), PATIENCE_S)
        except TimeoutError:
            raise AssertionError(f"the scaler never posted what was expected; posts: {self.posts}") from None


async def test_the_webhook_scaler_posts_desired_workers_as_the_queue_grows(tmp_path: Path) -> None:
    receiver = ScaleReceiver()
    runner = web.ServerRunner(web.Server(receiver.handle), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    receiver.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        url = f"http://127.0.0.1:{receiver.port}/scale"
        pools = (
            f'[[pools]]\nname = "scaled"\nmin = 1\nmax = 6\ndefault_duration_s = 30\n'
            f'scaler = {{ kind = "webhook", url = "{url}", token_env = "SCALE_HOOK_TOKEN" }}\n'
        )
        env = {"SCALE_HOOK_TOKEN": "hook-secret-0123456789"}
        async with server_process(tmp_path, config(pools=pools), env) as server, tasks_stub(server) as stub:
            assert receiver.posts == []  # nothing queued, nothing asked
            batch = pb.SubmitBatchRequest(tasks=[task("scaled")] * 200)
            await stub.SubmitBatch(batch, metadata=CLIENT, timeout=PATIENCE_S)
            # The backlog asks for more workers, up to the pool's max.
            await receiver.until(lambda: any(body["desired"] == 6 for _, body in receiver.posts))
        for authorization, body in receiver.posts:
            assert authorization == "Bearer hook-secret-0123456789"
            assert set(body) == {"pool", "desired"} and body["pool"] == "scaled"
            assert 1 <= body["desired"] <= 6
        # Each post is a change: the same count is never posted twice in a row.
        desired = [body["desired"] for _, body in receiver.posts]
        assert all(a != b for a, b in itertools.pairwise(desired)), desired
    finally:
        await runner.cleanup()
