"""gRPC-Web on the gRPC listener, driven by a real gRPC-Web client (Connect-ES's gRPC-Web
transport, from npm, run by Node.js) against a real 2-shard cluster, plus the wire rules a
browser relies on (CORS, refusals) checked with a plain HTTP client."""

from __future__ import annotations

import asyncio
import json
import shutil
import struct
import subprocess
from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio
from cronoq.cluster.launcher import Cluster
from cronoq.cluster.layout import ClusterOptions

from cronoq.client import Lease, Worker
from cronoq.proto import cronoq_pb2 as pb
from tests.grpcweb.npm import node_project

WEB = "application/grpc-web+proto"


pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Cluster]:
    options = ClusterOptions(
        shards=2, replicas=1, state=tmp_path_factory.mktemp("web-cluster"), base_port=0, grpc_web=True
    )
    running = Cluster(options, say=lambda text: None)
    await running.start()
    try:
        yield running
    finally:
        await running.stop()


async def _handle(lease: Lease) -> bytes:
    return b"done"


async def test_connect_es_client_over_both_shards(cluster: Cluster) -> None:
    project = node_project()
    s1, s2 = cluster.shard("s1"), cluster.shard("s2")
    workers = [
        Worker(s.plan.endpoint, pool, _handle, token=cluster.token("worker"), grace=0.5)
        for s, pool in ((s1, "default"), (s2, "pool2"))
    ]
    runs = [asyncio.ensure_future(worker.run()) for worker in workers]
    try:
        await asyncio.gather(*(worker.wait_registered(30) for worker in workers))
        scenario = {
            "url": f"http://127.0.0.1:{s1.plan.grpc_port}",
            "token": cluster.token("admin"),
            "pools": ["default", "pool2"],
        }
        command = [shutil.which("node") or "node", "client.mjs", json.dumps(scenario)]
        done = await asyncio.to_thread(
            subprocess.run, command, cwd=project, capture_output=True, text=True, timeout=120
        )
    finally:
        await asyncio.gather(*(worker.stop() for worker in workers), return_exceptions=True)
        await asyncio.gather(*runs, return_exceptions=True)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    submitted = {item["pool"]: int(item["id"]) for item in seen["submitted"]}
    assert submitted["default"] >> 56 == 1 and submitted["pool2"] >> 56 == 2  # one task in each shard
    # The Watch through shard 1 carried the terminal events of both shards.
    assert {(int(event["id"]), event["pool"]) for event in seen["watched"]} == {(i, p) for p, i in submitted.items()}
    assert {event["status"] for event in seen["watched"]} == {pb.TASK_STATUS_SUCCEEDED}
    # Get of shard 2's task through shard 1 (forwarded), a snapshot and a search over both.
    assert seen["get"] == {"id": str(submitted["pool2"]), "pool": "pool2", "status": pb.TASK_STATUS_SUCCEEDED}
    assert seen["snapshot_pools"] == ["default", "pool2"]
    assert seen["search"] == [str(submitted["pool2"]), str(submitted["default"])]  # newest first
    assert seen["bad_token"] == 16  # UNAUTHENTICATED


def _frame(message: bytes) -> bytes:
    return struct.pack("!BI", 0, len(message)) + message


async def test_cors_and_refusals(cluster: Cluster) -> None:
    s1 = cluster.shard("s1")
    base = f"http://127.0.0.1:{s1.plan.grpc_port}"
    allowed = f"http://127.0.0.1:{s1.plan.http_port}"
    auth = {"authorization": f"Bearer {cluster.token('metrics')}"}
    async with aiohttp.ClientSession() as http:
        preflight = {
            "Origin": allowed,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type,x-grpc-web",
        }
        async with http.options(base + "/cronoq.v1.Admin/Snapshot", headers=preflight) as answer:
            assert answer.status == 204
            assert answer.headers["Access-Control-Allow-Origin"] == allowed
            assert answer.headers["Access-Control-Allow-Methods"] == "POST"
            assert answer.headers["Access-Control-Allow-Headers"] == (
                "authorization, content-type, x-grpc-web, x-user-agent, grpc-timeout"
            )
            assert "Access-Control-Allow-Credentials" not in answer.headers
        stranger = {**preflight, "Origin": "https://evil.example"}
        async with http.options(base + "/cronoq.v1.Admin/Snapshot", headers=stranger) as answer:
            assert answer.status == 403
            assert not [name for name in answer.headers if name.lower().startswith("access-control-")]
        body = _frame(pb.Empty().SerializeToString())
        headers = {"content-type": WEB, "Origin": allowed, **auth}
        async with http.post(base + "/cronoq.v1.Admin/Snapshot", data=body, headers=headers) as answer:
            data = await answer.read()
            assert (
                answer.headers["Access-Control-Expose-Headers"] == "grpc-status, grpc-message, grpc-status-details-bin"
            )
        flag, length = struct.unpack_from("!BI", data)
        assert flag == 0 and {p.name for p in pb.SnapshotResponse.FromString(data[5 : 5 + length]).pools} == {
            "default",
            "pool2",
        }
        assert data[5 + length] == 0x80 and b"grpc-status:0" in data[5 + length :]

        async def status(path: str, content_type: str, payload: bytes, token: str = "metrics") -> tuple[str, str]:
            h = {"content-type": content_type, "authorization": f"Bearer {cluster.token(token)}"}
            async with http.post(base + path, data=payload, headers=h) as answer:
                return answer.headers.get("grpc-status", ""), answer.headers.get("grpc-message", "")

        assert (await status("/cronoq.v1.Admin/Snapshot", "application/grpc", body))[0] == "12"  # plain gRPC
        assert (await status("/cronoq.v1.Workers/Work", WEB, body, "worker"))[0] == "12"
        assert (await status("/cronoq.v1.Tasks/Cancel", WEB, _frame(b""), "metrics"))[0] == "7"  # needs client
        assert (await status("/cronoq.v1.Admin/Snapshot", WEB, b"\x00\x00\x00\x00\x09{}"))[0] == "3"
        assert (await status("/cronoq.v1.Tasks/Get", WEB, _frame(b"\xff\xff"), "client"))[0] == "3"
