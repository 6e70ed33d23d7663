"""``--ca``, ``--cert`` and ``--key-file`` against a server with TLS and client certificates."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cronoq.cli.exits import Exit
from tests.cli.conftest import Cli
from tests.server.harness import CLIENT_TOKEN, ServerProcess
from tests.server.test_tls import make_certificates

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


def test_https_with_a_private_ca_and_a_client_certificate(tmp_path: Path) -> None:
    make_certificates(tmp_path)
    config = f"""
[server]
grpc_addr = "127.0.0.1:{{port}}"
shutdown_grace_s = 0.5

[server.tls]
cert = "{tmp_path / "server.pem"}"
key = "{tmp_path / "server.key"}"
client_ca = "{tmp_path / "ca.pem"}"

[[auth.tokens]]
token = "{CLIENT_TOKEN}"
role = "client"

[[pools]]
name = "default"
"""
    server = ServerProcess(tmp_path, config, name="tls").start()
    try:
        cli = Cli(server.address)
        url = f"https://{server.address}"
        tls = ["--ca", str(tmp_path / "ca.pem"), "--cert", str(tmp_path / "client.pem")]
        key = ["--key-file", str(tmp_path / "client.key")]
        task_id = cli.ok("submit", "over tls", "--addr", url, *tls, *key, token=CLIENT_TOKEN).strip()
        assert cli.json("get", task_id, "--addr", url, *tls, *key, token=CLIENT_TOKEN)["status"] == "ready"
        # Without a client certificate the server refuses the handshake.
        bare = cli("get", task_id, "--addr", url, "--ca", str(tmp_path / "ca.pem"), token=CLIENT_TOKEN)
        assert bare.returncode == Exit.UNAVAILABLE
        half = cli("get", task_id, "--addr", url, *tls, token=CLIENT_TOKEN)
        assert half.returncode == Exit.USAGE and b"--key-file" in half.stderr
        unreadable = cli("get", task_id, "--addr", url, "--ca", str(tmp_path / "missing.pem"), token=CLIENT_TOKEN)
        assert unreadable.returncode == Exit.USAGE and b"missing.pem" in unreadable.stderr
        plain = cli("get", task_id, "--addr", f"http://{server.address}", *tls, *key, token=CLIENT_TOKEN)
        assert plain.returncode == Exit.USAGE and b"https://" in plain.stderr
    finally:
        server.stop()
