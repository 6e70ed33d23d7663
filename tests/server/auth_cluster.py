"""A two-shard cluster of real ``cronoq-server`` processes with one token per role and scope, and
blocking clients for it (the auth matrix runs hundreds of calls against one cluster).

Pools, in configuration order: ``alpha`` (shard s1, the first configured pool), ``beta`` (s2) and
``default`` (s1). So a pool-less call resolves to ``default`` by the spec's rule, while the first
configured pool is another one of the same shard: the difference a scope check done before the
pool is resolved would let through.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from cronoq.proto import console_pb2 as cpb
from cronoq.proto import console_pb2_grpc as cpbg
from cronoq.proto import cronoq_pb2 as pb
from cronoq.proto import cronoq_pb2_grpc as pbg
from tests.federation.conftest import Node, free_port

POOLS = ("alpha", "beta", "default")
OWNER = {"alpha": "s1", "beta": "s2", "default": "s1"}
"""The shard (and node: one node per shard) serving each pool."""
SCOPE = ("alpha",)
"""The pools of every scoped credential of the matrix."""
ROLES = ("client", "worker", "metrics", "admin")
MAX_KEY_LEN = 64

HOLD = {"hold": "never"}
"""Worker labels no worker has: tasks carrying them wait forever, so none is ever leased."""
YEARLY = "0 0 1 1 *"


@dataclass(frozen=True)
class Credential:
    """One caller of the matrix. ``role`` None: no credentials at all."""

    role: str | None
    pools: tuple[str, ...] | None = None

    @property
    def token(self) -> str | None:
        if self.role is None:
            return None
        scope = "all" if self.pools is None else "-".join(self.pools)
        return f"matrix-{self.role}-{scope}-0123456789abcdef"

    @property
    def name(self) -> str:
        if self.role is None:
            return "anonymous"
        return self.role if self.pools is None else f"{self.role}[{','.join(self.pools)}]"

    def sees(self, pool: str) -> bool:
        return self.pools is None or pool in self.pools

    def grants(self, needed: str) -> bool:
        return self.role == "admin" or self.role == needed

    def metadata(self) -> tuple[tuple[str, str], ...]:
        token = self.token
        return () if token is None else (("authorization", f"Bearer {token}"),)


ANONYMOUS = Credential(None)
CREDENTIALS = (
    ANONYMOUS,
    *(Credential(role) for role in ROLES),
    *(Credential(role, SCOPE) for role in ROLES),
)
ADMIN = Credential("admin")
DEFAULT_CLIENT = Credential("client", ("default",))
"""A client scoped to the default pool (pool-less calls on every node)."""


def _tokens_toml() -> str:
    out = []
    for credential in (*CREDENTIALS[1:], DEFAULT_CLIENT):
        pools = "" if credential.pools is None else f"pools = {json.dumps(list(credential.pools))}\n"
        out.append(f'[[auth.tokens]]\ntoken = "{credential.token}"\nrole = "{credential.role}"\n{pools}')
    return "\n".join(out)


def _config(ports: dict[str, int], directory: Path) -> str:
    return f"""
[server]
grpc_addr = "127.0.0.1:{{port}}"
http_addr = "127.0.0.1:{{http_port}}"
shutdown_grace_s = 1

[server.console]
enabled = true

[limits]
max_wait_s = 5
max_list = 50
max_key_len = {MAX_KEY_LEN}

[store]
kind = "sqlite"
path = "{directory}/{{shard}}.db"

{_tokens_toml()}
[[pools]]
name = "alpha"

[[pools]]
name = "beta"

[[pools]]
name = "default"

[[shards]]
name = "s1"
number = 1
pools = ["alpha", "default"]
endpoint = "http://127.0.0.1:{ports["s1"]}"

[[shards]]
name = "s2"
number = 2
pools = ["beta"]
endpoint = "http://127.0.0.1:{ports["s2"]}"
"""


@dataclass
class Outcome:
    """What one call answered, whatever carried it: a gRPC status name (HTTP statuses mapped to
    theirs), its message, the trailing metadata, and the response (message or JSON)."""

    code: str
    details: str = ""
    metadata: dict[str, str] | None = None
    body: Any = None
    http_status: int | None = None


HTTP_CODES = {
    200: "OK",
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "FAILED_PRECONDITION",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


class NodeClient:
    """Blocking gRPC stubs and an HTTP helper for one node."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.channel = grpc.insecure_channel(node.address)
        self.tasks = pbg.TasksStub(self.channel)
        self.admin = pbg.AdminStub(self.channel)
        self.workers = pbg.WorkersStub(self.channel)
        self.console = cpbg.ConsoleStub(self.channel)  # type: ignore[no-untyped-call]

    def close(self) -> None:
        self.channel.close()

    def call(self, credential: Credential, service: str, method: str, request: Any) -> Outcome:
        stub = getattr(self, service)
        try:
            response, call = getattr(stub, method).with_call(request, metadata=credential.metadata(), timeout=20)
        except grpc.RpcError as err:
            return Outcome(err.code().name, err.details() or "", dict(err.trailing_metadata() or ()))  # type: ignore[attr-defined]
        return Outcome("OK", "", dict(call.trailing_metadata() or ()), response)

    def http(self, credential: Credential, method: str, path: str, body: Any = None) -> Outcome:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.node.http + path, data=data, method=method)
        if credential.token is not None:
            request.add_header("Authorization", f"Bearer {credential.token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=20) as response:
                status, raw, kind = response.status, response.read(), response.headers.get("content-type", "")
        except urllib.error.HTTPError as err:
            status, raw, kind = err.code, err.read(), err.headers.get("content-type", "")
        parsed: Any = json.loads(raw) if "json" in kind and raw else raw.decode()
        details = parsed.get("error", "") if isinstance(parsed, dict) and status != 200 else ""
        return Outcome(HTTP_CODES.get(status, f"HTTP {status}"), details, None, parsed, status)

    @contextlib.contextmanager
    def http_stream(self, credential: Credential, path: str) -> Iterator[tuple[int, Any]]:
        """A GET whose answer is read line by line (the event stream): ``(200, response)``, or the
        status and the JSON error of a refusal."""
        request = urllib.request.Request(self.node.http + path)
        if credential.token is not None:
            request.add_header("Authorization", f"Bearer {credential.token}")
        try:
            response = urllib.request.urlopen(request, timeout=20)
        except urllib.error.HTTPError as err:
            yield err.code, json.loads(err.read())
            return
        with response:
            yield response.status, response


class AuthCluster:
    """Nodes s1 and s2, clients for both, and the tasks and schedules the matrix looks up."""

    def __init__(self, directory: Path) -> None:
        self.ports = {"s1": free_port(), "s2": free_port()}
        config = _config(self.ports, directory)
        self.nodes = {name: Node(directory, config, name, port, free_port(), name) for name, port in self.ports.items()}
        self.clients: dict[str, NodeClient] = {}
        self.seed: dict[str, int] = {}
        """A waiting task per pool (key ``seed-<pool>``)."""
        self.done: dict[str, int] = {}
        """A cancelled task per pool (key ``done-<pool>``)."""
        self._serial = itertools.count()
        self._workers: list[tuple[threading.Event, Any]] = []

    def start(self) -> AuthCluster:
        for node in self.nodes.values():
            node.start()
        self.clients = {name: NodeClient(node) for name, node in self.nodes.items()}
        for pool in POOLS:
            self.seed[pool] = self.submit(pool, f"seed-{pool}")
            self.done[pool] = self.submit(pool, f"done-{pool}")
            self.cancel(self.done[pool])
            self.add_schedule(f"sched-{pool}", pool)
            # A worker in every pool, so listings have something to hide.
            self._workers.append(self.register(OWNER[pool], ADMIN, pool, name=f"resident-{pool}"))
        return self

    def stop(self) -> None:
        for release, call in self._workers:
            release.set()
            call.cancel()
        for client in self.clients.values():
            client.close()
        for node in self.nodes.values():
            node.kill()

    def endpoint(self, shard: str) -> str:
        return f"http://127.0.0.1:{self.ports[shard]}"

    def unique(self, prefix: str) -> str:
        return f"{prefix}-{next(self._serial)}"

    # ---------------------------------------------------------------- the unscoped admin's view

    def submit(self, pool: str, key: str) -> int:
        spec = pb.TaskSpec(pool=pool, key=key, labels=HOLD)
        outcome = self.clients["s1"].call(ADMIN, "tasks", "Submit", pb.SubmitRequest(task=spec))
        assert outcome.code == "OK", outcome
        return int(outcome.body.id)

    def cancel(self, task_id: int) -> None:
        request = pb.CancelRequest(task=pb.TaskRef(id=task_id))
        outcome = self.clients["s1"].call(ADMIN, "tasks", "Cancel", request)
        assert outcome.code == "OK" and outcome.body.cancelled, outcome

    def find(self, key: str) -> pb.TaskInfo | None:
        """The task with ``key`` in any shard, as the unscoped admin sees it."""
        outcome = self.clients["s1"].call(ADMIN, "tasks", "Get", pb.GetRequest(task=pb.TaskRef(key=key)))
        if outcome.code == "NOT_FOUND":
            return None
        assert outcome.code == "OK", outcome
        info: pb.TaskInfo = outcome.body
        return info

    def status(self, task_id: int) -> int:
        outcome = self.clients["s1"].call(ADMIN, "tasks", "Get", pb.GetRequest(task=pb.TaskRef(id=task_id)))
        assert outcome.code == "OK", outcome
        return int(outcome.body.status)

    def add_schedule(self, name: str, pool: str, key: str = "") -> None:
        request = pb.RecurringRequest(name=name, cron=YEARLY, template=pb.TaskSpec(pool=pool, key=key))
        outcome = self.clients["s1"].call(ADMIN, "admin", "AddRecurring", request)
        assert outcome.code == "OK", outcome

    def schedules(self) -> dict[str, str]:
        """Every schedule of the cluster: name -> pool."""
        outcome = self.clients["s1"].call(ADMIN, "admin", "ListRecurring", pb.Empty())
        assert outcome.code == "OK" and not outcome.body.unavailable_shards, outcome
        return {schedule.name: schedule.pool for schedule in outcome.body.schedules}

    def pause_schedule(self, name: str) -> None:
        outcome = self.clients["s1"].call(ADMIN, "console", "PauseSchedule", cpb.ScheduleRequest(name=name))
        assert outcome.code == "OK" and outcome.body.found, outcome

    def paused(self) -> set[str]:
        """The names of the paused schedules (``cronoq.console.v1`` ListSchedules)."""
        outcome = self.clients["s1"].call(ADMIN, "console", "ListSchedules", pb.Empty())
        assert outcome.code == "OK" and not outcome.body.unavailable_shards, outcome
        return {schedule.info.name for schedule in outcome.body.schedules if schedule.paused}

    def remove_schedule(self, name: str) -> None:
        self.clients["s1"].call(ADMIN, "admin", "RemoveRecurring", pb.RemoveRecurringRequest(name=name))

    # ---------------------------------------------------------------- streams

    def register(
        self, node: str, credential: Credential, pool: str, *, name: str = "matrix"
    ) -> tuple[threading.Event, Any]:
        """A Work stream whose Register was answered with Registered; RpcError otherwise."""
        release = threading.Event()
        register = pb.Register(pool=pool, slots=1, worker_name=name, protocol_version=3)

        def messages() -> Iterator[pb.WorkerMessage]:
            yield pb.WorkerMessage(register=register)
            release.wait()

        call = self.clients[node].workers.Work(messages(), metadata=credential.metadata(), timeout=600)
        try:
            first = next(call)
        except BaseException:
            release.set()
            raise
        assert first.WhichOneof("msg") == "registered", first
        return release, call

    @contextlib.contextmanager
    def watching(self, node: str, credential: Credential, request: pb.WatchRequest) -> Iterator[Any]:
        """A Watch call, once the server answered its headers (subscribed, or refused)."""
        call = self.clients[node].tasks.Watch(request, metadata=credential.metadata(), timeout=20)
        try:
            call.initial_metadata()
            yield call
        finally:
            call.cancel()


@pytest.fixture(scope="module", name="cluster")
def running_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthCluster]:
    """One running ``AuthCluster`` per test module that imports this fixture."""
    running = AuthCluster(tmp_path_factory.mktemp("auth-cluster")).start()
    try:
        yield running
    finally:
        running.stop()
