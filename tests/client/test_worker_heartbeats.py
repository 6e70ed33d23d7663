"""The Worker's per-stream heartbeat scheduler (one loop timer for all leases of a stream)."""

from __future__ import annotations

import asyncio

from cronoq._client.session import Heartbeats
from cronoq.proto import cronoq_pb2 as pb
from tests.client.fake_server import eventually


class Leases:
    """Which (lease id, serial) pairs are running, and the heartbeats sent for them."""

    def __init__(self) -> None:
        self.running: dict[int, int] = {}
        self.sent: list[int] = []

    def still_running(self, lease_id: int, serial: int) -> bool:
        return self.running.get(lease_id) == serial

    def send(self, message: pb.WorkerMessage) -> None:
        assert message.WhichOneof("msg") == "heartbeat"
        self.sent.append(message.heartbeat.lease)

    def count(self, lease_id: int) -> int:
        return self.sent.count(lease_id)


async def test_each_lease_beats_at_its_own_period_until_it_ends() -> None:
    leases = Leases()
    beats = Heartbeats(asyncio.get_running_loop(), leases.send, leases.still_running)
    leases.running = {1: 10, 2: 11}
    beats.add(1, 10, 0.3, running=2)
    beats.add(2, 11, 0.01, running=2)
    try:
        await eventually(lambda: leases.count(2) >= 4, what="four beats of the short-period lease")
        assert leases.sent[0] == 2  # the shorter period comes due first, whatever the loop's delays
        del leases.running[2]
        ended_with = leases.count(2)
        await eventually(lambda: leases.count(1) >= 2, what="two beats of the long-period lease")
        assert leases.count(2) == ended_with  # no beat after the lease ended
    finally:
        beats.close()


async def test_a_new_record_for_the_same_lease_id_does_not_inherit_beats() -> None:
    leases = Leases()
    beats = Heartbeats(asyncio.get_running_loop(), leases.send, leases.still_running)
    leases.running = {7: 1, 8: 3}
    beats.add(7, 1, 0.01, running=2)
    beats.add(8, 3, 0.02, running=2)
    leases.running[7] = 2  # the old record ended; another one (not scheduled) took its id
    try:
        await eventually(lambda: leases.count(8) >= 2, what="beats of the other lease")
        assert leases.count(7) == 0
    finally:
        beats.close()


async def test_entries_of_ended_leases_are_compacted() -> None:
    leases = Leases()
    beats = Heartbeats(asyncio.get_running_loop(), leases.send, leases.still_running)
    try:
        for serial in range(5000):  # each lease ends before its first beat is due
            beats.add(serial, serial, 60.0, running=1)
        leases.running = {9999: 9999}
        beats.add(9999, 9999, 60.0, running=1)
        assert len(beats._due) <= 4 * 1 + 1024 + 1
        assert any(entry[2] == 9999 for entry in beats._due)
    finally:
        beats.close()


async def test_close_stops_all_beats() -> None:
    leases = Leases()
    beats = Heartbeats(asyncio.get_running_loop(), leases.send, leases.still_running)
    leases.running = {1: 1}
    beats.add(1, 1, 0.01, running=1)
    await eventually(lambda: leases.count(1) >= 1, what="a first beat")
    beats.close()
    after_close = leases.count(1)
    # Another stream's scheduler beating at the same period witnesses that several periods passed.
    witness = Heartbeats(asyncio.get_running_loop(), leases.send, leases.still_running)
    leases.running[2] = 1
    witness.add(2, 1, 0.01, running=1)
    try:
        await eventually(lambda: leases.count(2) >= 3, what="the witness's beats")
    finally:
        witness.close()
    assert leases.count(1) == after_close
