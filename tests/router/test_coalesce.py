"""The coalescing logic of forwarded Submits, with senders that record what was sent."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from cronoq.router.calls import status_of
from cronoq.router.coalesce import RESEND_CONCURRENCY, Route, SubmitCoalescer
from cronoq.router.errors import RouteError

from cronoq.proto import cronoq_pb2 as pb

from ..waiting import eventually


class Peer:
    """Answers Submits and SubmitBatches after a short delay, like a remote shard."""

    def __init__(self, refuse_batches: grpc.StatusCode | None = None) -> None:
        self.calls: list[int] = []  # tasks per call, in order
        self.routes: list[Route] = []  # the route each call was sent with
        self.refuse_batches = refuse_batches
        self.next_id = 1
        self.batches_held: asyncio.Event | None = None  # when set: batches wait for it
        self.in_flight = 0
        self.most_in_flight = 0  # Submits answered at once, at most

    def _admit(self, spec: pb.TaskSpec) -> pb.SubmitResponse:
        if spec.kind == "bad":
            raise RouteError(grpc.StatusCode.INVALID_ARGUMENT, "kind 'bad' is refused")
        self.next_id += 1
        return pb.SubmitResponse(id=self.next_id)

    async def one(self, route: Route, request: pb.SubmitRequest) -> pb.SubmitResponse:
        self.calls.append(1)
        self.routes.append(route)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.01)
        finally:
            self.in_flight -= 1
        return self._admit(request.task)

    async def batch(self, route: Route, request: pb.SubmitBatchRequest) -> pb.SubmitBatchResponse:
        self.calls.append(len(request.tasks))
        self.routes.append(route)
        await asyncio.sleep(0.01)
        if self.batches_held is not None:
            await self.batches_held.wait()
        if self.refuse_batches is not None:
            raise RouteError(self.refuse_batches, "task 3: refused")
        return pb.SubmitBatchResponse(tasks=[self._admit(task) for task in request.tasks])


def coalescer(peer: Peer, max_tasks: int = 100, calls_per_lane: int = 1) -> SubmitCoalescer:
    return SubmitCoalescer(max_tasks=max_tasks, max_bytes=1 << 20, status_of=status_of, send_one=peer.one,
                           send_batch=peer.batch, calls_per_lane=calls_per_lane)  # fmt: skip


def route(token: str = "token-a", shard: str = "s2") -> Route:
    return Route(shard, f"Bearer {token}", target=token)


async def submit_all(c: SubmitCoalescer, specs: list[pb.TaskSpec]) -> list[object]:
    async def one(spec: pb.TaskSpec) -> object:
        try:
            return await c.submit(route(), pb.SubmitRequest(task=spec))
        except RouteError as exc:
            return exc

    return list(await asyncio.gather(*(one(spec) for spec in specs)))


async def test_an_idle_lane_sends_at_once_and_later_submits_leave_together() -> None:
    peer = Peer()
    answers = await submit_all(coalescer(peer), [pb.TaskSpec() for _ in range(50)])
    assert peer.calls == [1, 49]
    assert len({answer.id for answer in answers}) == 50  # type: ignore[attr-defined]
    alone = await submit_all(coalescer(peer), [pb.TaskSpec()])
    assert isinstance(alone[0], pb.SubmitResponse) and peer.calls[-1] == 1


async def test_batches_respect_the_task_budget() -> None:
    peer = Peer()
    await submit_all(coalescer(peer, max_tasks=10), [pb.TaskSpec() for _ in range(31)])
    assert peer.calls == [1, 10, 10, 10]


async def test_a_refused_batch_is_sent_again_one_by_one() -> None:
    peer = Peer(refuse_batches=grpc.StatusCode.INVALID_ARGUMENT)
    specs = [pb.TaskSpec(kind="bad" if i == 3 else "") for i in range(6)]
    answers = await submit_all(coalescer(peer), specs)
    assert peer.calls == [1, 5, 1, 1, 1, 1, 1]
    assert isinstance(answers[3], RouteError) and answers[3].message == "kind 'bad' is refused"
    assert all(isinstance(answer, pb.SubmitResponse) for i, answer in enumerate(answers) if i != 3)


async def test_a_large_refused_batch_is_sent_again_a_few_at_a_time() -> None:
    peer = Peer(refuse_batches=grpc.StatusCode.INVALID_ARGUMENT)
    specs = [pb.TaskSpec(kind="bad" if i == 7 else "") for i in range(201)]
    answers = await submit_all(coalescer(peer, max_tasks=256), specs)
    assert peer.calls == [1, 200] + [1] * 200
    assert peer.most_in_flight == RESEND_CONCURRENCY
    assert [i for i, answer in enumerate(answers) if isinstance(answer, RouteError)] == [7]


@pytest.mark.parametrize("status", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED])
async def test_an_unknown_outcome_is_everyones_answer_and_nothing_is_resent(status: grpc.StatusCode) -> None:
    peer = Peer(refuse_batches=status)
    answers = await submit_all(coalescer(peer), [pb.TaskSpec() for _ in range(5)])
    assert peer.calls == [1, 4]  # no retry: the batch may have been written
    assert isinstance(answers[0], pb.SubmitResponse)
    assert all(isinstance(answer, RouteError) and answer.code == status for answer in answers[1:])


async def test_a_caller_that_gave_up_before_sending_is_left_out() -> None:
    peer = Peer()
    c = coalescer(peer)
    first = asyncio.ensure_future(c.submit(route(), pb.SubmitRequest(task=pb.TaskSpec())))
    await asyncio.sleep(0)
    waiting = [asyncio.ensure_future(c.submit(route(), pb.SubmitRequest(task=pb.TaskSpec())))
               for _ in range(3)]  # fmt: skip
    await asyncio.sleep(0)
    waiting[1].cancel()
    await first
    done = await asyncio.gather(waiting[0], waiting[2])
    assert peer.calls == [1, 2] and len(done) == 2


async def test_lanes_are_separate() -> None:
    peer = Peer()
    c = coalescer(peer)
    requests = [c.submit(route(f"token-{i % 2}"), pb.SubmitRequest(task=pb.TaskSpec())) for i in range(6)]
    await asyncio.gather(*requests)
    assert sorted(peer.calls) == [1, 1, 2, 2]
    # Each batch went with its own lane's credentials.
    assert {(r.target, n) for r, n in zip(peer.routes, peer.calls, strict=True) if n == 2} == {
        ("token-0", 2),
        ("token-1", 2),
    }


async def test_a_lane_keeps_several_calls_in_flight() -> None:
    peer = Peer()
    answers = await submit_all(coalescer(peer, calls_per_lane=3), [pb.TaskSpec() for _ in range(50)])
    assert peer.calls == [1, 1, 1, 47]  # three sent at once; the rest leave with the first to return
    assert len({answer.id for answer in answers}) == 50  # type: ignore[attr-defined]


async def test_closing_cancels_callers_still_waiting() -> None:
    peer = Peer()
    peer.batches_held = asyncio.Event()  # never set: the batch stays in flight
    c = coalescer(peer)
    calls = [asyncio.ensure_future(c.submit(route(), pb.SubmitRequest(task=pb.TaskSpec())))
             for _ in range(4)]  # fmt: skip
    await eventually(lambda: calls[0].done() and peer.calls == [1, 3])  # the first returned; a batch of 3 left
    await c.close()
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(outcomes[0], pb.SubmitResponse)
    assert all(isinstance(outcome, asyncio.CancelledError) for outcome in outcomes[1:])


async def test_an_idle_lane_is_dropped_and_keeps_nothing_of_its_callers() -> None:
    peer = Peer()
    c = coalescer(peer)
    await submit_all(c, [pb.TaskSpec() for _ in range(20)])
    assert c.lanes == 0
    waiting = [asyncio.ensure_future(c.submit(route(f"t{i}", f"s{i % 3}"), pb.SubmitRequest(task=pb.TaskSpec())))
               for i in range(12)]  # fmt: skip
    await asyncio.sleep(0)
    assert c.lanes == 12
    await asyncio.gather(*waiting)
    assert c.lanes == 0


def test_lanes_are_named_by_a_digest_of_the_credentials_never_the_token() -> None:
    token = "a-secret-bearer-token-0123456789"
    name = route(token).lane()
    assert name == route(token).lane() and name != route(token + "x").lane() and name != route(token, "s3").lane()
    assert token.encode() not in repr(name).encode() and token not in repr(route(token))
    assert not any(token in str(part) for part in name)
