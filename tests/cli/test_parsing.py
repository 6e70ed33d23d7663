"""The pure parts of the CLI, in process: escaping, addresses, durations, ``k=v`` pairs and ids."""

from __future__ import annotations

import json

import pytest

from cronoq.cli.connection import TlsFiles, is_loopback, parse_target, resolve
from cronoq.cli.exits import CliError, Exit
from cronoq.cli.spec import pairs, seconds, task_id
from cronoq.cli.text import dumps_json, escape_controls


def test_escape_controls() -> None:
    assert escape_controls("a\x1b[2Jb\x07") == "a\\u{1b}[2Jb\\u{7}"
    assert escape_controls("one\ntwo\tx") == "one\\u{a}two\\u{9}x"
    assert escape_controls("one\ntwo\tx\r", keep_lines=True) == "one\ntwo\tx\\u{d}"
    assert escape_controls("csi \x9b and rtl \u202e and caf\u00e9 \u4e2d") == (
        "csi \\u{9b} and rtl \\u{202e} and caf\u00e9 \u4e2d"
    )
    undecodable = b"ok \xff".decode("utf-8", errors="surrogateescape")
    assert escape_controls(undecodable) == "ok \\x{ff}"


def test_json_stays_valid_and_inert() -> None:
    value = {"key": "a\x1bb\u009b\u202e\u00e9", "n": 1}
    text = dumps_json(value)
    assert json.loads(text) == value
    assert "\x1b" not in text and "\u009b" not in text and "\u202e" not in text and "\u00e9" in text


def test_addresses() -> None:
    assert parse_target("http://127.0.0.1:7070").grpc_address == "127.0.0.1:7070"
    assert parse_target("localhost").grpc_address == "localhost:7070"
    secure = parse_target("https://[::1]:9443/")
    assert secure.secure and secure.grpc_address == "[::1]:9443"
    for bad in ("", "ftp://host:1", "http://host:99999", "http://host:1/path", "http://user@host:1"):
        with pytest.raises(CliError) as error:
            parse_target(bad)
        assert error.value.code == Exit.USAGE, bad
    assert is_loopback("localhost") and is_loopback("api.localhost") and is_loopback("127.0.0.9")
    assert is_loopback("::1") and not is_loopback("0.0.0.0") and not is_loopback("example.com")


def test_token_and_tls_rules() -> None:
    remote = resolve("http://10.1.2.3:7070", TlsFiles(), {"CRONOQ_TOKEN": "t" * 32})
    assert remote.token == "t" * 32 and len(remote.warnings) == 1 and "clear text" in remote.warnings[0]
    assert resolve("http://10.1.2.3:7070", TlsFiles(), {}).warnings == ()
    assert resolve(None, TlsFiles(), {"CRONOQ_ADDR": "https://h:1", "CRONOQ_TOKEN": "x"}).warnings == ()
    with pytest.raises(CliError):
        resolve(None, TlsFiles(), {"CRONOQ_TOKEN": "has space"})


def test_values() -> None:
    assert seconds("30", "--x") == 30.0 and seconds("250ms", "--x") == 0.25 and seconds("2h", "--x") == 7200.0
    assert pairs(["gpu=a100", "empty=", "eq=a=b"], "--label") == {"gpu": "a100", "empty": "", "eq": "a=b"}
    assert task_id("17") == 17
    for call in (
        lambda: seconds("-1", "--x"),
        lambda: seconds("soon", "--x"),
        lambda: pairs(["a=1", "a=2"], "--l"),
        lambda: pairs(["=v"], "--l"),
        lambda: task_id("0x11"),
        lambda: task_id("0"),
        lambda: task_id(str(2**64)),
    ):
        with pytest.raises(CliError):
            call()
