"""``convert.fill_lease`` returns a bound the batch writer sums instead of encoding each lease:
it must never be below what the lease really encodes to, or a batch could exceed the size the
worker announced it can receive."""

from __future__ import annotations

import pytest
from cronoq.engine import Priority
from cronoq.engine.actions import Dispatch
from cronoq.shard.blob import Blob

from cronoq.proto import cronoq_pb2 as pb
from cronoq.server import convert

LARGEST_ID = (1 << 64) - 1
ASTRAL = "\U0001f600"  # four bytes of UTF-8 for one code point
THREE_BYTE = "\u20ac"


def dispatch(**fields: object) -> Dispatch:
    values: dict[str, object] = {
        "id": 1,
        "task_id": 1,
        "attempt": 1,
        "pool": "p",
        "group": {},
        "payload": None,
        "kind": "",
        "key": None,
        "priority": Priority.NORMAL,
        "tags": {},
        "timeout": None,
        "deadline": None,
        "lease_ttl": None,
        "started_at": 0,
    }
    values.update(fields)
    return Dispatch(**values)  # type: ignore[arg-type]


CASES = {
    "smallest": dispatch(),
    "largest numbers and every optional field": dispatch(
        id=LARGEST_ID,
        task_id=LARGEST_ID,
        attempt=(1 << 32) - 1,
        priority=max(Priority),
        timeout=LARGEST_ID >> 1,
        deadline=-(1 << 63),
        lease_ttl=1,
    ),
    "big payload": dispatch(payload=Blob(b"\xff" * 3_000_000, "application/x-" + "y" * 200)),
    "astral strings": dispatch(
        pool=ASTRAL * 50,
        kind=ASTRAL * 300,
        key=ASTRAL * 40_000,
        payload=Blob(b"z", ASTRAL * 20),
    ),
    "three-byte strings": dispatch(pool=THREE_BYTE * 9, kind=THREE_BYTE * 200, key=THREE_BYTE),
    "many tags": dispatch(
        tags={f"t{i}{ASTRAL if i % 2 else ''}": THREE_BYTE * (i % 7) for i in range(500)},
    ),
    "long tag": dispatch(tags={"k" * 200_000: "v" * 300_000}),
}


@pytest.mark.parametrize("lease", CASES.values(), ids=CASES.keys())
def test_the_lease_size_bound_is_never_below_the_encoded_size(lease: Dispatch) -> None:
    message = pb.Lease()
    bound = convert.fill_lease(message, lease)
    assert message.ByteSize() <= bound
    # Inside a batch each lease also costs its field tag and length prefix, which the batch
    # writer adds as 8 bytes.
    batch = pb.ServerMessage()
    batch.batch.leases.add().CopyFrom(message)
    assert batch.batch.ByteSize() <= bound + 8
