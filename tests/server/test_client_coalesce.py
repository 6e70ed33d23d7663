"""``Client(coalesce=True)`` against a real server: concurrent single submits travel as SubmitBatch
calls, and every caller still gets the answer (or the error) its own Submit would have got."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from cronoq._client.client import COALESCE_CALLS
from cronoq.client import Client, ClientError, Submitted
from tests.server.harness import CLIENT_TOKEN, ServerProcess


@pytest.fixture
async def coalescing(server: ServerProcess) -> AsyncIterator[Client]:
    async with Client(server.address, token=CLIENT_TOKEN, coalesce=True) as client:
        yield client


def batches(client: Client) -> int:
    coalescer = client._coalescer
    return 0 if coalescer is None else coalescer.batches_sent


async def test_concurrent_submits_share_batches_and_each_caller_gets_its_own_task(coalescing: Client) -> None:
    run = uuid.uuid4().hex[:8]
    keys = [f"co-{run}-{n}" for n in range(200)]
    answers = await asyncio.gather(*(coalescing.submit({"n": n}, key=key, pool="other") for n, key in enumerate(keys)))
    # All but the first few waited for a call in flight, so they left in SubmitBatch calls.
    assert batches(coalescing) >= 1
    assert len({answer.id for answer in answers}) == len(keys)
    assert not any(answer.duplicate for answer in answers)
    for key, answer in zip(keys, answers, strict=True):
        info = await coalescing.get(answer.id)
        assert (info.key, info.pool) == (key, "other")


async def test_refused_batch_gives_every_caller_its_own_answer(coalescing: Client) -> None:
    run = uuid.uuid4().hex[:8]
    good = [f"ok-{run}-{n}" for n in range(20)]

    async def submit(n: int) -> Submitted | BaseException:
        try:
            if n % 5 == 1:
                return await coalescing.submit(None, pool="no-such-pool")
            if n % 5 == 3:
                return await coalescing.submit(None, key="k" * 200, pool="other")  # over max_key_len
            return await coalescing.submit(None, key=good[n], pool="other")
        except ClientError as exc:
            return exc

    answers = await asyncio.gather(*(submit(n) for n in range(len(good))))
    assert batches(coalescing) >= 1
    for n, answer in enumerate(answers):
        if n % 5 == 1:
            assert isinstance(answer, ClientError) and answer.code == "not_found", answer
            assert "no-such-pool" in answer.message
        elif n % 5 == 3:
            assert isinstance(answer, ClientError) and answer.code == "invalid_argument", answer
            assert "key" in answer.message
        else:
            assert isinstance(answer, Submitted), answer
            assert (await coalescing.get(answer.id)).key == good[n]


async def test_the_same_key_twice_is_one_task(coalescing: Client) -> None:
    key = f"twice-{uuid.uuid4().hex[:8]}"
    # Occupy every call in flight, so the two submits of the key leave in one batch.
    fillers = [coalescing.submit(None, pool="other") for _ in range(COALESCE_CALLS)]
    answers = await asyncio.gather(*fillers, coalescing.submit(None, key=key, pool="other"),
                                   coalescing.submit(None, key=key, pool="other"))  # fmt: skip
    first, second = answers[-2:]
    assert first.id == second.id
    assert (first.duplicate, second.duplicate) == (False, True)


async def test_wait_and_call_timeout_go_alone(coalescing: Client) -> None:
    await coalescing.submit(None, pool="other")
    sent = batches(coalescing)
    answers = await asyncio.gather(*(coalescing.submit(None, pool="other", call_timeout=10) for _ in range(20)))
    assert len({answer.id for answer in answers}) == 20
    assert batches(coalescing) == sent


async def test_a_cancelled_caller_is_dropped_and_the_others_are_answered(coalescing: Client) -> None:
    fillers = [asyncio.ensure_future(coalescing.submit(None, pool="other")) for _ in range(COALESCE_CALLS)]
    await asyncio.sleep(0)  # they are in flight now
    queued = [asyncio.ensure_future(coalescing.submit(None, pool="other")) for _ in range(3)]
    await asyncio.sleep(0)  # queued behind them
    queued[1].cancel()
    done = await asyncio.gather(*fillers, queued[0], queued[2])
    assert len({answer.id for answer in done}) == COALESCE_CALLS + 2
    assert queued[1].cancelled()


async def test_closing_cancels_queued_callers_and_the_client_reopens(server: ServerProcess) -> None:
    client = Client(server.address, token=CLIENT_TOKEN, coalesce=True)
    fillers = [asyncio.ensure_future(client.submit(None, pool="other")) for _ in range(COALESCE_CALLS)]
    await asyncio.sleep(0)
    queued = asyncio.ensure_future(client.submit(None, pool="other"))
    await asyncio.sleep(0)
    await client.close()
    with pytest.raises(asyncio.CancelledError):
        await queued
    await asyncio.gather(*fillers, return_exceptions=True)
    answer = await client.submit(None, pool="other")  # a closed client opens a new channel
    assert answer.id > 0
    await client.close()


async def test_a_large_refused_batch_is_resent_within_the_servers_in_flight_limit(coalescing: Client) -> None:
    # One bad task among hundreds: the refused batch is resent one Submit per task, never so many
    # at once that the server's per-credential in-flight limit (256 by default) refuses good ones.
    run = uuid.uuid4().hex[:8]
    count = 400
    bad = COALESCE_CALLS + 7

    async def submit(n: int) -> Submitted | BaseException:
        try:
            if n == bad:
                return await coalescing.submit(None, pool="no-such-pool")
            return await coalescing.submit(None, key=f"big-{run}-{n}", pool="other")
        except ClientError as exc:
            return exc

    answers = await asyncio.gather(*(submit(n) for n in range(count)))
    assert batches(coalescing) >= 1
    refused = [n for n, answer in enumerate(answers) if isinstance(answer, ClientError)]
    assert refused == [bad], [answers[n] for n in refused[:3]]
