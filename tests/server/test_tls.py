"""TLS listeners with client certificates mapped to roles ([[auth.certs]])."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import grpc
import pytest

from cronoq.client import Client, ClientError, Lease, Worker
from tests.server.harness import CLIENT_TOKEN, ServerProcess

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


def _openssl(directory: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)


def make_certificates(directory: Path) -> None:
    """A CA, a server certificate for 127.0.0.1 and a client certificate for worker-1.internal."""
    _openssl(
        directory,
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=cronoq-test-ca",
    )
    for name, san in (("server", "IP:127.0.0.1,DNS:localhost"), ("client", "DNS:worker-1.internal")):
        (directory / f"{name}.ext").write_text(f"subjectAltName={san}\n")
        _openssl(
            directory,
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            "-subj",
            f"/CN={name}",
        )
        _openssl(
            directory,
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.pem",
            "-days",
            "2",
            "-extfile",
            f"{name}.ext",
        )


async def test_a_client_certificate_maps_to_its_role_and_a_token_wins(tmp_path: Path) -> None:
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

[[auth.certs]]
dns_name = "worker-1.internal"
role = "worker"
pools = ["default"]
"""
    server = ServerProcess(tmp_path, config, name="tls").start()
    try:
        ca = (tmp_path / "ca.pem").read_bytes()
        credentials = grpc.ssl_channel_credentials(
            ca, (tmp_path / "client.key").read_bytes(), (tmp_path / "client.pem").read_bytes()
        )

        async def handler(lease: Lease) -> bytes:
            return b"over tls"

        # The certificate alone is a worker credential: no token needed.
        worker = Worker(server.address, "default", handler, credentials=credentials, reconnect=False)
        serving = asyncio.ensure_future(worker.run())
        await worker.wait_registered(10)
        # The same certificate cannot submit; with a client token it can (the token wins).
        async with Client(server.address, credentials=credentials) as as_worker:
            with pytest.raises(ClientError) as err:
                await as_worker.submit(b"")
            assert err.value.code == "permission_denied"
        async with Client(server.address, credentials=credentials, token=CLIENT_TOKEN) as client:
            done = await client.submit(b"", wait=True, wait_timeout=10)
            assert done.result is not None and done.result.output == b"over tls"
        # Without a client certificate the TLS handshake itself is refused.
        async with Client(server.address, credentials=grpc.ssl_channel_credentials(ca), token=CLIENT_TOKEN) as bare:
            with pytest.raises(ClientError) as refused:
                await bare.submit(b"", call_timeout=5)
            assert refused.value.code == "unavailable"
        await worker.stop(1)
        await serving
    finally:
        server.stop()
