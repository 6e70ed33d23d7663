"""The peer link's framing: whatever way the bytes are split, every frame comes out whole and in
order; calls and replies decode to what was encoded; oversized or foreign streams are refused."""

from __future__ import annotations

import struct

import pytest
from cronoq.router.link import PREFACE, FrameReader, decode_reply, decode_request, encode_reply, encode_request
from hypothesis import given
from hypothesis import strategies as st

from cronoq._linkwire import PEER_PREFACE, PREFACES, WORKER_PREFACE, decode_status, encode_status, frame

LIMIT = 4096

bodies = st.binary(max_size=600)
tokens = st.one_of(st.none(), st.text(min_size=1, max_size=80))
metadata = st.lists(
    st.tuples(st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=20),
              st.text(alphabet=st.characters(blacklist_characters="\0"), max_size=40)),
    max_size=4,
)  # fmt: skip


@given(
    calls=st.lists(st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 254), st.floats(0.001, 1e6), tokens, bodies),
                   min_size=1, max_size=8),
    cuts=st.lists(st.integers(1, 200), max_size=30),
)  # fmt: skip
def test_requests_survive_any_split_of_the_stream(calls: list, cuts: list[int]) -> None:
    stream = PREFACE + b"".join(encode_request(*call) for call in calls)
    reader = FrameReader(LIMIT)
    frames: list[bytes] = []
    offset = 0
    for cut in [*cuts, len(stream)]:
        frames += reader.feed(stream[offset : offset + cut])
        offset += cut
        if offset >= len(stream):
            break
    frames += reader.feed(stream[offset:])
    decoded = [decode_request(frame) for frame in frames]
    assert len(decoded) == len(calls)
    for (call_id, method, timeout, token, body), (got_id, got_method, got_timeout, got_token, got_body) in zip(
        calls, decoded, strict=True
    ):
        assert (got_id, got_method, got_token or None, got_body) == (call_id, method, utf8(token or "") or None, body)
        assert got_timeout == pytest.approx(max(0.001, min(timeout, 0xFFFFFFFF / 1000)), abs=0.001)


@given(call_id=st.integers(0, 2**32 - 1), status=st.integers(0, 255), message=st.text(max_size=100),
       meta=metadata, body=bodies)  # fmt: skip
def test_replies_decode_to_what_was_sent(call_id: int, status: int, message: str, meta: list, body: bytes) -> None:
    reader = FrameReader(LIMIT)
    (frame,) = reader.feed(PREFACE + encode_reply(call_id, status, message, tuple(meta), body))
    assert decode_reply(frame) == (call_id, status, utf8(message), tuple((k, utf8(v)) for k, v in meta), body)


def utf8(text: str) -> str:
    """``text`` as it crosses a link: what UTF-8 cannot carry (lone surrogates) becomes "?"."""
    return text.encode("utf-8", "replace").decode("utf-8")


def test_a_stream_without_the_preface_is_refused() -> None:
    with pytest.raises(ValueError, match="not a cronoq link"):
        FrameReader(LIMIT).feed(b"GET / HTTP/1.1\r\n")
    assert FrameReader(LIMIT).feed(PREFACE[:5]) == []  # a preface still arriving is fine


def test_a_frame_above_the_limit_is_refused_before_it_arrives() -> None:
    reader = FrameReader(LIMIT)
    with pytest.raises(ValueError, match="larger than"):
        reader.feed(PREFACE + struct.pack(">I", LIMIT + 1))


def test_truncated_frames_do_not_decode() -> None:
    frame = encode_request(7, 1, 1.0, "Bearer abc", b"xyz")[4:]
    with pytest.raises(ValueError):
        decode_request(frame[:5])
    with pytest.raises(ValueError):
        decode_request(frame[:12])
    with pytest.raises(ValueError):
        decode_reply(encode_reply(1, 0, "message", (("k", "v"),), b"")[4:10])


def test_a_listener_tells_peer_and_worker_links_apart() -> None:
    for preface in PREFACES:
        reader = FrameReader(LIMIT)
        assert reader.feed(preface[:7]) == [] and reader.preface is None
        assert reader.feed(preface[7:] + frame(b"x")) == [b"x"]
        assert reader.preface == preface
    with pytest.raises(ValueError):
        FrameReader(LIMIT, (PEER_PREFACE,)).feed(WORKER_PREFACE)  # a peer link's client wants a peer


@given(code=st.integers(0, 255), message=st.text(max_size=100), meta=metadata, tail=bodies)
def test_statuses_decode_to_what_was_sent(code: int, message: str, meta: list, tail: bytes) -> None:
    body = encode_status(code, message, tuple(meta))
    assert decode_status(body + tail) == (code, utf8(message), tuple((k, utf8(v)) for k, v in meta), len(body))
