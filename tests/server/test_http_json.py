"""The HTTP gateway's body reader: the one-pass reading of common ``POST /v1/tasks`` bodies gives
exactly what the field-by-field reader gives, and declines everything else to it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from cronoq.config import AuthConfig, Role, TokenSpec
from cronoq.config.auth import digest
from hypothesis import given, settings
from hypothesis import strategies as st

from cronoq.proto import cronoq_pb2 as pb
from cronoq.server import http_json
from cronoq.server.auth import VERIFIED_CREDENTIALS, Authenticator
from cronoq.server.errors import ApiError
from cronoq.server.json_shapes import PRIORITIES, submit_json
from tests.fuzz.budget import examples

TEXT_FIELDS = ("pool", "kind", "key", "tenant")

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
"""Any JSON value a body can carry (text with NUL, surrogates and non-ASCII included)."""

field_values = st.one_of(
    json_values,
    st.sampled_from([*PRIORITIES, "urgent", ""]),
    st.text(alphabet=st.characters(codec="ascii"), max_size=12),
)
common_bodies = st.dictionaries(
    st.sampled_from([*TEXT_FIELDS, "payload", "priority", "wait", "content_type", "deadline_in_s", "retry", "x"]),
    field_values,
    max_size=6,
)


def read(reader: Any, body: Any) -> tuple[str, Any]:
    """What a reader makes of ``body``: the message it built, or the refusal (code and text)."""
    try:
        return "message", reader(body).SerializeToString(deterministic=True)
    except ApiError as error:
        return "refused", (error.code, error.message)


@settings(max_examples=examples(300), deadline=None)
@given(st.one_of(common_bodies, json_values))
def test_the_one_pass_reader_agrees_with_the_field_by_field_one(body: dict[str, Any]) -> None:
    # Through JSON and back, as the gateway sees it (a payload becomes its JSON text).
    body = json.loads(json.dumps(body))
    assert read(http_json.submit_request, body) == read(http_json._read_submit, body)


@pytest.mark.parametrize(
    "body",
    [
        {"pool": "default", "payload": 7, "key": "k-1", "priority": "high", "kind": "email", "tenant": "acme"},
        {"payload": {"nested": ["list", 1, None]}, "pool": None},
        {},
    ],
)
def test_common_bodies_take_the_one_pass_reader(body: dict[str, Any]) -> None:
    read_once = http_json._common_submit(body)
    assert read_once is not None
    assert read_once == http_json._read_submit(body)


@pytest.mark.parametrize(
    "body",
    [
        {"pool": "d\u00e9faut"},  # not ASCII: checked field by field
        {"key": "a\0b"},
        {"kind": 3},
        {"priority": "urgent"},
        {"wait": True},
        {"payload": "x", "content_type": "text/plain"},
        {"payload": "\ud800"},
        ["not", "an", "object"],
    ],
)
def test_other_bodies_are_left_to_the_field_by_field_reader(body: Any) -> None:
    assert http_json._common_submit(body) is None


def test_submit_answers_are_written_as_json_shapes_writes_them() -> None:
    for response in (pb.SubmitResponse(id=2**64 - 1, duplicate=True), pb.SubmitResponse(id=5)):
        assert http_json.submit_body(response) == http_json.dumps(submit_json(response))
    waited = pb.SubmitResponse(id=9)
    waited.result.status = pb.TASK_STATUS_SUCCEEDED
    assert json.loads(http_json.submit_body(waited)) == submit_json(waited)


def test_verified_credentials_are_remembered_and_refusals_are_not() -> None:
    auth = Authenticator(AuthConfig(tokens=(TokenSpec(Role.CLIENT, digest=digest("s3cret"), pools=("a",)),)))
    first = auth.authenticate("Bearer s3cret")
    assert auth.authenticate("Bearer s3cret") is first
    assert (first.role, first.pools, first.authorization) == (Role.CLIENT, frozenset({"a"}), "Bearer s3cret")
    for _ in range(2):  # a refused value is looked up again each time, never remembered
        with pytest.raises(ApiError, match="unknown token"):
            auth.authenticate("Bearer wrong")
    # Many spellings of one token (trailing spaces): the memory stays bounded and still answers.
    spellings = [f"Bearer s3cret{' ' * n}" for n in range(VERIFIED_CREDENTIALS + 5)]
    assert all(auth.authenticate(value).role is Role.CLIENT for value in spellings)
    assert len(auth._verified) <= VERIFIED_CREDENTIALS
