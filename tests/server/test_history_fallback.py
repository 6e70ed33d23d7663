"""Task history past key retention, on a real ``cronoq-server`` process (SQLite and Postgres).

With ``limits.key_retention_s = 1`` the engine forgets a finished task one second after it ends:
its key is free again (the spec's retention rule: a new task may take it). Its row stays in the
store for ``store.keep_finished_s``, so by id it is still found: gRPC Get, Wait and Cancel, the
HTTP task routes, listings and the console's search, across both transports.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

from cronoq.client import Client, Lease, Worker
from cronoq.proto import console_pb2 as cpb
from cronoq.proto import console_pb2_grpc as cpbg
from cronoq.proto import cronoq_pb2 as pb
from tests.server.harness import CLIENT_TOKEN, TOKENS_TOML, WORKER_TOKEN
from tests.server.http_support import HttpServerProcess, request, until_forgotten

CONFIG = """
[server]
grpc_addr = "127.0.0.1:{port}"
http_addr = "127.0.0.1:{http_port}"
shutdown_grace_s = 0.5

[limits]
key_retention_s = 1
max_wait_s = 5

STORE

TOKENS

[[pools]]
name = "default"

[[pools]]
name = "other"
"""


@pytest.fixture(params=["sqlite", "postgres"])
async def server(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[HttpServerProcess]:
    if request.param == "sqlite":
        store = f'[store]\nkind = "sqlite"\npath = "{tmp_path / "cronoq.db"}"'
        dsn = None
    else:
        dsn = request.getfixturevalue("postgres_dsn")
        schema = f"cronoq_hist_{uuid.uuid4().hex[:10]}"
        store = f'[store]\nkind = "postgres"\nurl = "{dsn}"\nschema = "{schema}"'
    text = CONFIG.replace("STORE", store).replace("TOKENS", TOKENS_TOML)
    process = HttpServerProcess(tmp_path, text, name=f"history-{request.param}").start()
    try:
        yield process
    finally:
        process.stop()
        if dsn is not None:
            import asyncpg

            conn = await asyncpg.connect(dsn)
            try:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            finally:
                await conn.close()


async def answer(lease: Lease) -> dict[str, Any]:
    return {"answer": lease.json()["n"] * 2}


async def test_a_task_past_key_retention_is_still_found_by_id(server: HttpServerProcess) -> None:
    worker = Worker(server.address, "default", answer, token=WORKER_TOKEN, backoff=(0.05, 0.2))
    serving = asyncio.ensure_future(worker.run())
    try:
        await worker.wait_registered(10)
        async with Client(server.address, token=CLIENT_TOKEN) as client:
            done = await client.submit({"n": 21}, key="hist-key", kind="history", wait=True, wait_timeout=10)
            assert done.result is not None and done.result.json() == {"answer": 42}
            await until_forgotten(client, "hist-key")

            # gRPC: by id the store answers for the engine.
            info = await client.get(done.id)
            assert (info.status, info.key, info.kind) == ("succeeded", "hist-key", "history")
            result = await client.wait(done.id, timeout=1)
            assert result.status == "succeeded" and result.json() == {"answer": 42}
            assert await client.cancel(done.id) is False  # finished long ago: nothing to cancel
            listed = [task.id async for task in client.iter_tasks(statuses=["succeeded"])]
            assert done.id in listed

            async with grpc.aio.insecure_channel(server.address) as channel:
                search = cpbg.ConsoleStub(channel).SearchTasks  # type: ignore[no-untyped-call]
                metadata = (("authorization", f"Bearer {CLIENT_TOKEN}"),)
                page_of_ten = pb.ListTasksRequest(limit=10)
                query = cpb.SearchTasksRequest(key_prefix="hist-", kinds=["history"], list=page_of_ten)
                found = await search(query, metadata=metadata)
                assert [task.id for task in found.tasks] == [done.id]

            # HTTP: the same task, its result and its detail; by key it is gone.
            headers = {"authorization": f"Bearer {CLIENT_TOKEN}"}
            async with aiohttp.ClientSession(server.http_url, headers=headers) as http:
                status, body = await request(http, "GET", f"/v1/tasks/{done.id}")
                assert (status, body["status"], body["output_available"]) == (200, "succeeded", True)
                status, body = await request(http, "GET", f"/v1/tasks/{done.id}/result?timeout_s=0")
                assert (status, body["output"]) == (200, {"answer": 42})
                assert (await request(http, "GET", "/v1/tasks/by-key/hist-key"))[0] == 404
                _, page = await request(http, "GET", "/v1/tasks?key_prefix=hist-&status=succeeded")
                assert [task["id"] for task in page["tasks"]] == [str(done.id)]
                _, detail = await request(http, "GET", f"/v1/tasks/{done.id}/detail")
                assert detail["transitions"][-1]["status"] == "succeeded"
                assert detail["spec"]["key"] == "hist-key"

            # The key is free: it names a new task now, and the history keeps both.
            again = await client.submit({"n": 1}, key="hist-key", kind="history", wait=True, wait_timeout=10)
            assert not again.duplicate and again.id != done.id
            async with aiohttp.ClientSession(server.http_url, headers=headers) as http:
                _, page = await request(http, "GET", "/v1/tasks?key_prefix=hist-&newest_first=true")
                assert [task["id"] for task in page["tasks"]] == [str(again.id), str(done.id)]
    finally:
        await worker.stop(1)
        await serving
