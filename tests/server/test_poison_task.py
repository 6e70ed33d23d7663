"""A poison task against a real ``cronoq-server`` process: it fails itself, never its shard.

Reported defect: a retry policy whose backoff overflows (a huge multiplier, or many attempts)
made the engine step raise when the task failed; the error was logged at debug, the task stayed
running forever, and after a restart recovery met the same task and raised again, so the shard
never led again (``/readyz`` 503 for good). Now the arithmetic is bounded, out-of-range numbers
are refused at admission (INVALID_ARGUMENT / 400 naming the field), and a store holding a row
that cannot run is loaded with that task dead-lettered, counted in ``cronoq_engine_errors_total``.

Spec: reference-facts.md ("client-supplied durations <= 100 years, else INVALID_ARGUMENT";
/readyz; error mapping), book "HTTP API" (durations finite and non-negative), design.md "Trust
boundaries".
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cronoq.stores import _rows as R

from cronoq.client import Client, ClientError, Lease, Worker
from tests.server.harness import CLIENT_TOKEN, METRICS_TOKEN, TOKENS_TOML, WORKER_TOKEN
from tests.server.http_support import HttpServerProcess, request

WAIT_S = 30.0


def config(db: Path) -> str:
    return f"""
[server]
grpc_addr = "127.0.0.1:{{port}}"
http_addr = "127.0.0.1:{{http_port}}"
shutdown_grace_s = 0.5

[store]
kind = "sqlite"
path = "{db}"

[limits]
max_wait_s = 30

{TOKENS_TOML}
[[pools]]
name = "default"

[[pools]]
name = "other"
"""


async def ready(http: aiohttp.ClientSession) -> int:
    """The /readyz status once the server answers (503 while it stands by)."""
    for _ in range(300):
        try:
            status, _ = await request(http, "GET", "/readyz")
            if status == 200:
                return status
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.1)
    return (await request(http, "GET", "/readyz"))[0]


async def engine_errors(http: aiohttp.ClientSession) -> float:
    status, text = await request(http, "GET", "/metrics", headers={"authorization": f"Bearer {METRICS_TOKEN}"})
    assert status == 200, text
    values = [line.split()[-1] for line in text.splitlines() if line.startswith("cronoq_engine_errors_total")]
    assert len(values) == 1, text
    return float(values[0])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServerProcess]:
    directory = tmp_path_factory.mktemp("poison")
    proc = HttpServerProcess(directory, config(directory / "shard.db"), name="poison")
    try:
        yield proc.start()
    finally:
        proc.stop()


async def failing(lease: Lease) -> bytes:
    if lease.payload == b"ok":
        return b"fine"
    raise RuntimeError(f"attempt {lease.attempt} failed")


async def test_a_task_whose_backoff_used_to_overflow_is_dead_lettered_and_the_shard_serves_on(
    server: HttpServerProcess,
) -> None:
    worker = Worker(server.address, "default", failing, token=WORKER_TOKEN, backoff=(0.05, 0.2), slots=2)
    serving = asyncio.ensure_future(worker.run())
    try:
        await worker.wait_registered(10)
        async with (
            Client(server.address, token=CLIENT_TOKEN) as client,
            aiohttp.ClientSession(server.http_url, headers={"authorization": f"Bearer {CLIENT_TOKEN}"}) as http,
        ):
            # gRPC: 1e308 ** 2 overflowed when the third attempt failed.
            huge = {
                "max_attempts": 6,
                "initial_backoff": 0.001,
                "multiplier": 1e308,
                "max_backoff": 0.01,
                "jitter": False,
            }
            grpc_task = await client.submit(b"poison", retry=huge)
            # HTTP: the same through the gateway, with 1e200 (its square overflows too).
            status, body = await request(
                http,
                "POST",
                "/v1/tasks",
                json={
                    "payload_b64": "cG9pc29u",
                    "retry": {
                        "max_attempts": 5,
                        "initial_backoff_s": 0.001,
                        "multiplier": 1e200,
                        "max_backoff_s": 0.01,
                        "jitter": False,
                    },
                },
            )
            assert status == 200, body
            http_task = int(body["id"])

            result = await client.wait(grpc_task.id, timeout=WAIT_S)  # before the fix: never ends
            assert (result.status, result.message) == ("dead_lettered", "RuntimeError: attempt 6 failed")
            info = await client.get(grpc_task.id)
            assert (info.attempt, info.max_attempts) == (6, 6)
            status, body = await request(http, "GET", f"/v1/tasks/{http_task}/result?timeout_s={WAIT_S}")
            assert (status, body["status"], body["message"]) == (200, "dead_lettered", "RuntimeError: attempt 5 failed")

            # The shard serves on.
            assert await ready(http) == 200
            done = await client.submit(b"ok", wait=True, wait_timeout=WAIT_S)
            assert done.result is not None and done.result.output == b"fine"
            assert await engine_errors(http) == 0  # nothing raised inside the engine at all
            assert "Numerical result out of range" not in server.stderr()
    finally:
        await worker.stop(1)
        await asyncio.wait_for(serving, 10)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"deadline_unix_ns": -1}, "deadline_unix_ns"),
        ({"start_unix_ns": -(2**63)}, "start_unix_ns"),
        ({"timeout_s": 1e308}, "timeout_s"),
        ({"tolerance_s": -1.0, "start_in_s": 5.0}, "tolerance_s"),
        ({"duration_hint_s": float("inf")}, "duration_hint_s"),
        ({"retry": {"multiplier": float("nan")}}, "retry.multiplier"),
        ({"retry": {"multiplier": float("inf")}}, "retry.multiplier"),
        ({"retry": {"multiplier": 0.5}}, "retry.multiplier"),
        ({"retry": {"initial_backoff_s": -1.0}}, "retry.initial_backoff_s"),
        ({"retry": {"max_backoff_s": 1e300}}, "retry.max_backoff_s"),
    ],
)
async def test_grpc_refuses_numbers_out_of_range_naming_the_field(
    server: HttpServerProcess, spec: dict[str, Any], field: str
) -> None:
    from cronoq.proto import cronoq_pb2 as pb

    async with Client(server.address, token=CLIENT_TOKEN) as client:
        task = pb.TaskSpec(pool="other")
        for name, value in spec.items():
            if name == "retry":
                for key, number in value.items():
                    setattr(task.retry, key, number)
            else:
                setattr(task, name, value)
        before = (await client.list_tasks(pools=["other"])).tasks
        with pytest.raises(ClientError) as err:
            await client.submit_batch([task])
        assert err.value.code == "invalid_argument" and field in err.value.message, err.value.message
        assert (await client.list_tasks(pools=["other"])).tasks == before  # nothing admitted


@pytest.mark.parametrize(
    ("task", "field"),
    [
        ('"deadline_unix_ns": "-5"', "deadline_unix_ns"),
        ('"deadline_unix_ns": "99999999999999999999"', "deadline_unix_ns"),
        ('"timeout_s": 1e400', "timeout_s"),
        ('"start_in_s": -1', "start_in_s"),
        ('"retry": {"max_attempts": 2, "multiplier": 1e400}', "multiplier"),
        ('"retry": {"max_attempts": 2, "initial_backoff_s": -0.5}', "initial_backoff_s"),
        ('"retry": {"max_attempts": 4294967296}', "max_attempts"),
    ],
)
async def test_http_refuses_numbers_out_of_range_with_400(server: HttpServerProcess, task: str, field: str) -> None:
    async with aiohttp.ClientSession(server.http_url, headers={"authorization": f"Bearer {CLIENT_TOKEN}"}) as http:
        await ready(http)
        before = (await request(http, "GET", "/v1/tasks?pool=other"))[1]["tasks"]
        body = '{"pool": "other", ' + task + "}"  # literal JSON numbers (1e400 overflows to infinity)
        status, answer = await request(
            http, "POST", "/v1/tasks", data=body, headers={"content-type": "application/json"}
        )
        assert status == 400 and field in answer["error"], answer
        status, listed = await request(http, "GET", "/v1/tasks?pool=other")
        assert status == 200 and listed["tasks"] == before  # nothing admitted


async def test_a_server_restarted_on_a_store_with_bad_rows_leads_and_reports_them(tmp_path: Path) -> None:
    db = tmp_path / "shard.db"
    server = HttpServerProcess(tmp_path, config(db), name="restarted")
    try:
        server.start()
        async with Client(server.address, token=CLIENT_TOKEN) as client:
            ids = {key: (await client.submit(b"x", pool="other", key=key)).id for key in ("overflow", "nan", "healthy")}
    finally:
        server.stop()
    # Edit the rows behind the server's back: a running task whose next backoff used to overflow
    # (attempt 1025 of a doubling policy) and one whose policy is NaN, as a tampered row can hold.
    overflow = {
        "status": "ready",
        "retry": {
            "max_attempts": 2000,
            "initial_backoff": 10**9,
            "multiplier": 2.0,
            "max_backoff": 60 * 10**9,
            "jitter": False,
        },
    }
    nan = {
        "status": "ready",
        "retry": {
            "max_attempts": 5,
            "initial_backoff": 1,
            "multiplier": float("nan"),
            "max_backoff": 5,
            "jitter": False,
        },
    }
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        for key, spec, attempt, max_attempts in (("overflow", overflow, 1025, 2000), ("nan", nan, 1, 5)):
            conn.execute(
                "UPDATE cronoq_tasks SET status = 'running', attempt = ?, max_attempts = ?, spec = ? WHERE id = ?",
                (attempt, max_attempts, json.dumps(spec), R.to_db_id(ids[key])),
            )
    finally:
        conn.close()

    try:
        server.start()  # same database; before the fix the server never led again
        async with aiohttp.ClientSession(server.http_url, headers={"authorization": f"Bearer {CLIENT_TOKEN}"}) as http:
            assert await ready(http) == 200
            status, nan_task = await request(http, "GET", f"/v1/tasks/{ids['nan']}")
            assert status == 200 and nan_task["status"] == "dead_lettered", nan_task
            assert "retry.multiplier" in nan_task["message"], nan_task
            status, overflowed = await request(http, "GET", f"/v1/tasks/{ids['overflow']}")
            assert (status, overflowed["status"], overflowed["attempt"]) == (200, "retrying", 1025)
            status, healthy = await request(http, "GET", f"/v1/tasks/{ids['healthy']}")
            assert (status, healthy["status"]) == (200, "ready")
            assert await engine_errors(http) == 1
        assert f"recovered task {ids['nan']} dead-lettered: cannot be restored" in server.stderr()
    finally:
        server.stop()
