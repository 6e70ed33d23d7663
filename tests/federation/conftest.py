"""Two-shard clusters of real ``cronoq-server`` processes for the routing tests.

Shard ``s1`` (number 1) serves pools ``default`` and ``other``; shard ``s2`` (number 2) serves
``p2``. Every node reads the same file and is started with ``--shard``; the shards' endpoints are
the nodes' own gRPC ports on loopback.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.harness import TOKENS_TOML, ServerProcess

P2_CLIENT_TOKEN = "p2-client-token-0123456789abcdef"
"""A client token scoped to pool p2 (shard s2)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Node(ServerProcess):
    """A server process on ports chosen before the shared configuration is written."""

    def __init__(self, directory: Path, config: str, shard: str, port: int, http_port: int, name: str) -> None:
        super().__init__(directory, config.replace("{http_port}", str(http_port)), name=name, args=("--shard", shard))
        self.fixed_port = port
        self.http_port = http_port

    def start(self, expect: str = "listening", timeout: float = 30.0, attempts: int = 1) -> Node:
        self.port = self.fixed_port
        self._spawn()
        self.wait_for(expect, timeout)
        self.seen.clear()
        return self

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"


class Federation:
    def __init__(self, directory: Path, store: str, limits: str = "") -> None:
        self.ports = {"s1": free_port(), "s2": free_port()}
        self.config = f"""
[server]
grpc_addr = "127.0.0.1:{{port}}"
http_addr = "127.0.0.1:{{http_port}}"
shutdown_grace_s = 1

[limits]
max_wait_s = 5
max_list = 50
{limits}

{store}

{TOKENS_TOML}
[[auth.tokens]]
token = "{P2_CLIENT_TOKEN}"
role = "client"
pools = ["p2"]

[[pools]]
name = "default"
retry = {{ max_attempts = 2, initial_backoff_s = 0.02, max_backoff_s = 0.05 }}

[[pools]]
name = "other"

[[pools]]
name = "p2"

[[resources]]
kind = "semaphore"
name = "gpu"
permits = 1
shard = "s2"

[[shards]]
name = "s1"
number = 1
pools = ["default", "other"]
endpoint = "http://127.0.0.1:{self.ports["s1"]}"

[[shards]]
name = "s2"
number = 2
pools = ["p2"]
endpoint = "http://127.0.0.1:{self.ports["s2"]}"
"""
        self.directory = directory
        self.nodes = {
            name: Node(directory, self.config, name, port, free_port(), name) for name, port in self.ports.items()
        }

    def start(self) -> Federation:
        for node in self.nodes.values():
            node.start()  # "listening" is printed once the node leads its shard
        return self

    def stop(self) -> None:
        for node in self.nodes.values():
            node.kill()

    def __getitem__(self, name: str) -> Node:
        return self.nodes[name]


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory, postgres_dsn: str) -> Iterator[Federation]:
    """Two shards on Postgres, one schema per shard (dropped afterwards)."""
    prefix = f"cronoq_f{uuid.uuid4().hex[:10]}"
    store = f'[store]\nkind = "postgres"\nurl = "{postgres_dsn}"\nschema = "{prefix}_{{shard}}"'
    cluster = Federation(tmp_path_factory.mktemp("federation"), store).start()
    try:
        yield cluster
    finally:
        cluster.stop()
        _drop_schemas(postgres_dsn, prefix)


def _drop_schemas(dsn: str, prefix: str) -> None:
    import asyncio

    import asyncpg

    async def drop() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            for shard in ("s1", "s2"):
                await conn.execute(f'DROP SCHEMA IF EXISTS "{prefix}_{shard}" CASCADE')
        finally:
            await conn.close()

    asyncio.run(drop())


@pytest.fixture
def sqlite_federation(tmp_path: Path) -> Iterator[Federation]:
    """Two shards on SQLite files, for tests that take a shard down."""
    store = f'[store]\nkind = "sqlite"\npath = "{tmp_path}/{{shard}}.db"'
    cluster = Federation(tmp_path, store).start()
    try:
        yield cluster
    finally:
        cluster.stop()
