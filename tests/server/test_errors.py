"""Every request error reachable over gRPC, with the status the contract names."""

from __future__ import annotations

import math

import grpc
import pytest

from cronoq.client import Client, ClientError, task
from cronoq.proto import cronoq_pb2 as pb
from cronoq.proto import cronoq_pb2_grpc as pbg
from tests.server.harness import CLIENT_TOKEN, ServerProcess


def spec(**fields: object) -> pb.TaskSpec:
    message = pb.TaskSpec(pool="other")
    for name, value in fields.items():
        if name == "deps":
            message.deps.extend(value)  # type: ignore[arg-type]
        elif name in ("tags", "labels", "resources"):
            getattr(message, name).update(value)
        else:
            setattr(message, name, value)
    return message


BAD_SPECS = [
    ("both deadlines", spec(deadline_in_s=5, deadline_unix_ns=1), "invalid_argument", "not both"),
    ("both starts", spec(start_in_s=5, start_unix_ns=1), "invalid_argument", "not both"),
    ("negative duration", spec(timeout_s=-1), "invalid_argument", "invalid duration"),
    ("NaN duration", spec(deadline_in_s=math.nan), "invalid_argument", "invalid duration"),
    ("infinite duration", spec(duration_hint_s=math.inf), "invalid_argument", "invalid duration"),
    ("two centuries", spec(start_in_s=200 * 366 * 86400.0), "invalid_argument", "invalid duration"),
    ("NUL in key", spec(key="a\0b"), "invalid_argument", "NUL"),
    ("NUL in kind", spec(kind="a\0b"), "invalid_argument", "NUL"),
    ("NUL in tag", spec(tags={"t": "x\0"}), "invalid_argument", "NUL"),
    ("key too long", spec(key="k" * 65), "invalid_argument", "longer than 64"),
    ("content type too long", spec(content_type="x" * 129), "invalid_argument", "content_type"),
    ("unknown priority", spec(priority=9), "invalid_argument", "priority"),
    ("unknown pool", spec(pool="nope"), "not_found", "unknown pool"),
    ("unknown dependency id", spec(deps=[pb.Dep(target=pb.TaskRef(id=987654321))]), "not_found", ""),
    ("unknown dependency key", spec(deps=[pb.Dep(target=pb.TaskRef(key="never-seen"))]), "not_found", ""),
    ("dependency without target", spec(deps=[pb.Dep()]), "invalid_argument", "deps[0]"),
    ("unknown resource", spec(resources={"tpu": 1}), "invalid_argument", "tpu"),
    ("resource above capacity", spec(resources={"gpu": 3}), "invalid_argument", "gpu"),
    ("self cycle", spec(key="self", deps=[pb.Dep(target=pb.TaskRef(key="self"))]), "invalid_argument", ""),
    ("zero timeout", spec(timeout_s=0), "invalid_argument", "timeout"),
]


@pytest.mark.parametrize(("what", "message", "code", "text"), BAD_SPECS, ids=[case[0] for case in BAD_SPECS])
async def test_malformed_specs_are_refused(
    client: Client, what: str, message: pb.TaskSpec, code: str, text: str
) -> None:
    with pytest.raises(ClientError) as err:
        await client.submit_batch([message])
    assert err.value.code == code, err.value.message
    assert text in err.value.message


async def test_batch_errors_name_the_offending_task_and_admit_nothing(client: Client) -> None:
    with pytest.raises(ClientError) as err:
        await client.submit_batch([spec(key="atomic-1"), spec(key="atomic-2", timeout_s=-5)])
    assert err.value.code == "invalid_argument" and "task 1" in err.value.message
    with pytest.raises(ClientError) as cycle:
        await client.submit_batch(
            [
                task(b"", pool="other", key="cyc-a", after="cyc-b"),
                task(b"", pool="other", key="cyc-b", after="cyc-a"),
            ]
        )
    assert cycle.value.code == "invalid_argument"
    with pytest.raises(ClientError) as twice:
        await client.submit_batch([task(b"", pool="other", key="twice"), task(b"", pool="other", key="twice")])
    assert twice.value.code == "invalid_argument"
    for key in ("atomic-1", "cyc-a", "twice"):
        with pytest.raises(ClientError) as gone:
            await client.get(key)
        assert gone.value.code == "not_found"


async def test_reservation_conflict_is_failed_precondition(client: Client) -> None:
    # Pool "fixed" has max = 2 and the default reservable fraction 0.5: one reservation at a time.
    first = await client.submit(b"", pool="fixed", start_in=3600, key="res-1")
    with pytest.raises(ClientError) as err:
        await client.submit(b"", pool="fixed", start_in=3600, key="res-2")
    assert err.value.code == "failed_precondition"
    await client.cancel(first.id)


async def test_a_full_pool_is_resource_exhausted(client: Client) -> None:
    # Pool "tiny" allows one pending task and rejects beyond that.
    first = await client.submit(b"", pool="tiny")
    with pytest.raises(ClientError) as err:
        await client.submit(b"", pool="tiny")
    assert err.value.code == "resource_exhausted" and err.value.retryable
    await client.cancel(first.id)
    again = await client.submit(b"", pool="tiny")
    await client.cancel(again.id)


async def test_request_shape_errors(server: ServerProcess) -> None:
    metadata = (("authorization", f"Bearer {CLIENT_TOKEN}"),)
    async with grpc.aio.insecure_channel(server.address) as channel:
        tasks = pbg.TasksStub(channel)
        cases = [
            (tasks.Submit(pb.SubmitRequest(task=spec(), wait_timeout_s=1), metadata=metadata), "wait_timeout_s"),
            (tasks.Get(pb.GetRequest(), metadata=metadata), "id or a key"),
            (tasks.Get(pb.GetRequest(task=pb.TaskRef(key="")), metadata=metadata), "empty"),
            (
                tasks.ListTasks(pb.ListTasksRequest(statuses=[pb.TASK_STATUS_UNSPECIFIED]), metadata=metadata),
                "UNSPECIFIED",
            ),
            (tasks.Wait(pb.WaitRequest(task=pb.TaskRef(id=1), timeout_s=-1), metadata=metadata), "invalid duration"),
            (tasks.SubmitBatch(pb.SubmitBatchRequest(tasks=[spec()] * 1001), metadata=metadata), "at most 1000"),
        ]
        for call, text in cases:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
            assert text in (err.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await tasks.ListTasks(pb.ListTasksRequest(pools=["nope"]), metadata=metadata)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
