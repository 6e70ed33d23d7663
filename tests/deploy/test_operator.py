"""The worker operator's decisions (cronoq.operator), read from real cronoq-server processes.

Servers run as real processes with real gRPC; pools get a backlog without workers, so their
autoscalers raise the desired capacity to the pool's ``max``. The operator's reader and rules
then decide what a worker Deployment should have. The Kubernetes side (watching scalers, the
scale subresource, status writes) needs an API server, which this machine does not have: the
chart and CRD are checked by tests/deploy/test_helm_operator.py instead.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kopf
import pytest
import yaml

from cronoq.client import Client
from cronoq.operator import main as operator_main
from cronoq.operator.decide import Reading, Reason, ScalerSpec, SpecError, Targets, decide, status_of
from cronoq.operator.reading import ServerReader, ServerView
from cronoq.operator.settings import ServerSettings, SettingsError, parse
from tests.server.harness import CLIENT_TOKEN, METRICS_TOKEN, TOKENS_TOML, WORKER_TOKEN, ServerProcess

from .conftest import DEPLOY, free_port, run

CRD = DEPLOY / "helm" / "cronoq-operator" / "crds" / "cronoqworkerscalers.yaml"

POOLS = """
[[pools]]
name = "default"

[[pools]]
name = "llm"
min = 0
max = 10

[[pools]]
name = "other"
"""


def spec(**fields: Any) -> ScalerSpec:
    return ScalerSpec.from_body(
        {"server": "main", "pool": "llm", "deployment": "llm-workers", "maxReplicas": 100, **fields}
    )


def settings(url: str, token_file: Path) -> ServerSettings:
    return ServerSettings(name="main", url=url, token_file=token_file)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server whose pool llm has 40 tasks waiting and no workers."""
    directory = tmp_path_factory.mktemp("operator-server")
    process = ServerProcess(directory, '[server]\ngrpc_addr = "127.0.0.1:{port}"\n' + TOKENS_TOML + POOLS).start()

    async def backlog() -> None:
        async with Client(process.address, token=CLIENT_TOKEN) as client:
            for _ in range(40):
                await client.submit(b"waiting", pool="llm")

    asyncio.run(backlog())
    try:
        yield process
    finally:
        process.stop()


def token_file(directory: Path, token: str) -> Path:
    """A file holding ``token``, as a mounted Secret would (one file per token)."""
    path = directory / f"token-{token[:12]}"
    path.write_text(token + "\n")
    return path


async def settled_view(reader: ServerReader, pool: str, desired: int, limit: float = 60.0) -> ServerView:
    """The server's view once the pool's autoscaler reached ``desired`` (it steps up each second)."""
    deadline = time.monotonic() + limit
    while True:
        view = await reader.view()
        if view.desired is not None and view.desired.get(pool) == desired:
            return view
        assert time.monotonic() < deadline, f"desired of {pool} never reached {desired}: {view}"
        await asyncio.sleep(0.2)


async def test_replicas_follow_the_pools_desired_slots(server: ServerProcess, tmp_path: Path) -> None:
    reader = ServerReader(settings(f"http://{server.address}", token_file(tmp_path, METRICS_TOKEN)))
    try:
        view = await settled_view(reader, "llm", 10)  # 40 waiting, pool max 10
        cases = [
            (spec(slotsPerReplica=4), "llm", 10, 3),  # ceil(10 / 4)
            (spec(slotsPerReplica=1, maxReplicas=6), "llm", 10, 6),  # clamped to maxReplicas
            (spec(slotsPerReplica=4, pool="default", minReplicas=2), "default", 1, 2),  # clamped to minReplicas
            (spec(slotsPerReplica=3), "other", 1, 1),  # pool min 1 by default: one slot wanted
        ]
        for scaler, pool, slots, replicas in cases:
            reading = view.reading(pool)
            assert reading.desired_slots == slots, pool
            decision = decide(scaler, reading, current=0, targets=Targets(), now=0.0)
            assert (decision.replicas, decision.reason, decision.desired_slots) == (replicas, Reason.SCALED, slots)
            assert decide(scaler, reading, current=replicas, targets=Targets(), now=0.0).replicas is None
    finally:
        await reader.close()


async def test_the_deployment_is_left_alone_when_the_pool_cannot_be_read(server: ServerProcess, tmp_path: Path) -> None:
    url = f"http://{server.address}"
    wrong = ServerReader(settings(url, token_file(tmp_path, "not-a-token-0123456789abcdef")))
    worker = ServerReader(ServerSettings("main", url, token_file=token_file(tmp_path, WORKER_TOKEN)))
    missing = ServerReader(ServerSettings("main", url, token_file=tmp_path / "no-such-token"))
    good = ServerReader(settings(url, token_file(tmp_path, METRICS_TOKEN)))
    down = ServerReader(settings(f"http://127.0.0.1:{free_port()}", token_file(tmp_path, METRICS_TOKEN)), timeout=5)
    try:
        expected = {
            wrong: Reason.UNAUTHORIZED,  # an unknown token
            worker: Reason.UNAUTHORIZED,  # a token without the metrics role
            missing: Reason.UNAUTHORIZED,  # no token file
            down: Reason.SERVER_UNAVAILABLE,  # nothing listens there
        }
        for reader, reason in expected.items():
            reading = (await reader.view()).reading("llm")
            assert reading.desired_slots is None and reading.reason == reason, reading
            targets = Targets()
            decision = decide(spec(), reading, current=7, targets=targets, now=0.0)
            assert decision.replicas is None and decision.reason == reason
            assert "left alone" in decision.message
        reading = (await good.view()).reading("gpu")  # a pool the server does not have
        assert reading.reason == Reason.POOL_NOT_REPORTED and "gpu" in reading.message
        assert decide(spec(pool="gpu"), reading, current=7, targets=Targets(), now=0.0).replicas is None
    finally:
        for reader in (wrong, worker, missing, good, down):
            await reader.close()


def test_a_pool_of_an_unreachable_shard_is_not_reported_and_its_workers_stay(tmp_path: Path) -> None:
    ports = {"s1": free_port(), "s2": free_port()}
    shards = "".join(
        f'\n[[shards]]\nname = "{name}"\nnumber = {n}\npools = {pools}\nendpoint = "http://127.0.0.1:{port}"\n'
        for n, ((name, port), pools) in enumerate(
            zip(ports.items(), ('["default", "llm"]', '["other"]'), strict=True), start=1
        )
    )
    config = "[server]\n" + TOKENS_TOML + POOLS + shards
    servers = {
        name: ServerProcess(tmp_path, config, name=name, args=("--shard", name, "--grpc-addr", f"127.0.0.1:{port}"))
        for name, port in ports.items()
    }
    for process in servers.values():
        process.start()
    reader = ServerReader(settings(f"http://127.0.0.1:{ports['s1']}", token_file(tmp_path, METRICS_TOKEN)))

    async def views() -> tuple[ServerView, ServerView]:
        try:
            whole = await reader.view()
            servers["s2"].stop()
            return whole, await reader.view()
        finally:
            await reader.close()

    try:
        whole, partial = asyncio.run(views())
    finally:
        for process in servers.values():
            process.stop()
    assert whole.desired is not None and set(whole.desired) == {"default", "llm", "other"}
    assert whole.reading("other").desired_slots is not None
    reading = partial.reading("other")
    assert reading.reason == Reason.POOL_NOT_REPORTED and "s2" in reading.message
    assert decide(spec(pool="other"), reading, current=4, targets=Targets(), now=0.0).replicas is None
    assert partial.reading("llm").desired_slots is not None  # the reachable shard's pools still count


def test_scaling_up_is_immediate_and_scaling_down_waits_for_a_whole_window() -> None:
    scaler = spec(slotsPerReplica=1, scaleDownStabilizationSeconds=60)
    targets = Targets()
    assert decide(scaler, Reading.of(8), 2, targets, now=0.0).replicas == 8
    # A dip (a failover, a quiet second) does not take workers away ...
    for now in (15.0, 30.0, 45.0):
        decision = decide(scaler, Reading.of(3), 8, targets, now)
        assert decision.replicas is None and decision.reason == Reason.HOLDING
    # ... once no reading of the last 60 s wanted 8, it goes down to the highest that was wanted.
    decision = decide(scaler, Reading.of(2), 8, targets, now=75.0)
    assert decision.replicas == 3 and decision.reason == Reason.SCALED
    assert decide(scaler, Reading.of(2), 3, targets, now=110.0).replicas == 2
    # A failed reading starts the window over: nothing goes down right after a server comes back.
    assert decide(scaler, Reading.failed(Reason.SERVER_UNAVAILABLE, "down"), 2, targets, now=120.0).replicas is None
    assert decide(scaler, Reading.of(0), 2, targets, now=125.0).replicas is None
    assert decide(scaler, Reading.of(0), 2, targets, now=190.0).replicas == 0
    # Without a window, the target applies at once.
    assert decide(spec(scaleDownStabilizationSeconds=0), Reading.of(1), 9, Targets(), now=0.0).replicas == 1


def test_a_missing_deployment_is_reported_not_created() -> None:
    decision = decide(spec(), Reading.of(5), None, Targets(), now=0.0)
    assert decision.replicas is None and decision.reason == Reason.DEPLOYMENT_NOT_FOUND


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"server": ""}, "spec.server"),
        ({"maxReplicas": None}, "spec.maxReplicas"),
        ({"slotsPerReplica": 0}, "spec.slotsPerReplica"),
        ({"minReplicas": 5, "maxReplicas": 2}, "spec.minReplicas"),
        ({"intervalSeconds": 1}, "spec.intervalSeconds"),
        ({"minReplicas": True}, "spec.minReplicas"),
        ({"scaleDownStabilizationSeconds": 10**9}, "spec.scaleDownStabilizationSeconds"),
    ],
)
def test_a_spec_that_cannot_work_is_refused_naming_the_field(fields: dict[str, Any], field: str) -> None:
    body = {"server": "main", "pool": "llm", "deployment": "w", "maxReplicas": 3, **fields}
    body = {key: value for key, value in body.items() if value is not None}
    with pytest.raises(SpecError, match=field.replace(".", r"\.")):
        ScalerSpec.from_body(body)


def _crd() -> dict[str, Any]:
    crd: dict[str, Any] = yaml.safe_load(CRD.read_text())
    return crd


def test_the_status_written_fits_the_crd_and_keeps_what_a_failed_reading_cannot_know() -> None:
    schema = _crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    scaled = status_of(
        decide(spec(slotsPerReplica=4), Reading.of(10), 1, Targets(), 0.0), 3, 2, {}, "2026-01-01T00:00:00Z"
    )
    jsonschema.validate(scaled, schema)
    assert scaled["desiredSlots"] == 10 and scaled["replicas"] == 3 and scaled["observedGeneration"] == 2
    assert scaled["conditions"][0]["status"] == "True" and scaled["lastScaleTime"] == "2026-01-01T00:00:00Z"
    failed = status_of(
        decide(spec(), Reading.failed(Reason.SERVER_UNAVAILABLE, "server 'main' did not answer"), 3, Targets(), 15.0),
        3,
        2,
        scaled,
        "2026-01-01T00:00:15Z",
    )
    jsonschema.validate(failed, schema)
    assert failed["reason"] == Reason.SERVER_UNAVAILABLE and failed["desiredSlots"] == 10  # the last known
    assert failed["lastScaleTime"] == "2026-01-01T00:00:00Z"
    assert failed["conditions"][0] == {
        **failed["conditions"][0],
        "status": "False",
        "lastTransitionTime": "2026-01-01T00:00:15Z",
    }
    again = status_of(
        decide(spec(), Reading.failed(Reason.SERVER_UNAVAILABLE, "server 'main' did not answer"), 3, Targets(), 30.0),
        3,
        2,
        failed,
        "2026-01-01T00:00:30Z",
    )
    assert again == failed  # nothing changed, so nothing is written


def test_the_operators_configuration_is_checked_naming_the_key(tmp_path: Path) -> None:
    good = '[[servers]]\nname = "main"\nurl = "http://cronoq.cronoq:7070"\ntoken_file = "/t"\n'
    assert list(parse(good).servers) == ["main"]
    for text, key in [
        ("", "servers"),
        ('[[servers]]\nname = "Main"\nurl = "http://a:1"\ntoken_file = "/t"\n', "servers[0].name"),
        ('[[servers]]\nname = "m"\nurl = "a:1"\ntoken_file = "/t"\n', "servers[0].url"),
        ('[[servers]]\nname = "m"\nurl = "http://a:1"\n', "token_file"),
        ('[[servers]]\nname = "m"\nurl = "http://a:1"\ntoken_file = "/t"\nca_file = "/c"\n', "servers[0].ca_file"),
        (good + good, "named twice"),
        (good + "[extra]\n", "extra"),
    ]:
        with pytest.raises(SettingsError, match=key.replace("[", r"\[").replace("]", r"\]")):
            parse(text)
    path = tmp_path / "operator.toml"
    path.write_text(good)
    done = run([sys.executable, "-m", "cronoq.operator.main", "--config", path, "--check"])
    assert "servers main" in done.stdout
    path.write_text(good.replace("http://", ""))
    done = run([sys.executable, "-m", "cronoq.operator.main", "--config", path, "--check"], check=False)
    assert done.returncode == 2 and "servers[0].url" in done.stderr


def test_kopf_only_watches_so_the_operator_needs_no_finalizer_and_posts_no_events() -> None:
    from kopf._core.intents import registries

    registry = registries.get_default_registry()
    assert [h.id for h in registry._watching.get_all_handlers()] == ["_scaler_event"]
    # Daemons, timers and change handlers would add finalizers and patch the scalers themselves,
    # which the ClusterRole does not allow.
    assert registry._spawning.get_all_handlers() == [] and registry._changing.get_all_handlers() == []
    settings = kopf.OperatorSettings()
    operator_main.prepare(settings)
    assert settings.posting.enabled is False and settings.scanning.disabled is True
    assert settings.peering.standalone is True
