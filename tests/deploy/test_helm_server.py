"""The server chart (deploy/helm/cronoq), rendered by the real helm over a matrix of values.

Every rendered object is validated against the Kubernetes OpenAPI schemas of the oldest and the
newest supported release (and the ServiceMonitor against the Prometheus Operator's), and the
configuration it writes is checked by the real ``cronoq-server --check`` for every shard.
"""

from __future__ import annotations

import asyncio
import base64
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from cronoq.client import Client
from tests.server.harness import ServerProcess

from .conftest import DEPLOY, run
from .kube import KUBERNETES_VERSIONS, Obj, find, lint, one, render, render_error, validate

CHART = DEPLOY / "helm" / "cronoq"
ROLES = ("client", "worker", "metrics", "admin")
POOLS = (
    '[[pools]]\nname = "default"\nmax = 50\n[[pools]]\nname = "llm"\nmax = 200\nlease_ttl_s = 120\n'
    '[[pools]]\nname = "batch"\n'
)
THREE_SHARDS = [
    {"name": "cpu", "number": 1, "pools": ["default"]},
    {"name": "gpu", "number": 2, "pools": ["llm"], "replicas": 3},
    {"name": "batch", "number": 3, "pools": ["batch"]},
]

CASES: dict[str, dict[str, Any]] = {
    # One group of servers, trying it out: memory store, one replica, tokens made by the chart.
    "one-memory-generated-tokens": {"store": {"kind": "memory"}, "replicas": 1},
    # One group with standbys on Postgres; the chart keeps the URL and the tokens in Secrets.
    "one-postgres-generated-secrets": {
        "store": {"postgres": {"url": "postgres://cronoq:pw@db:5432/cronoq"}},
        "config": POOLS,
    },
    # One group, existing Secrets, TLS, a ServiceMonitor.
    "one-postgres-existing-secrets-tls": {
        "auth": {"existingSecret": "cronoq-tokens"},
        "store": {"postgres": {"urlSecret": {"name": "cronoq-db"}}},
        "tls": {"secretName": "cronoq-tls"},
        "metrics": {"serviceMonitor": {"enabled": True}},
        "config": POOLS,
    },
    # Three shards with TLS between them, existing Secrets, the plain metrics listener.
    "three-shards-tls-existing-secrets": {
        "shards": THREE_SHARDS,
        "tls": {"secretName": "cronoq-tls"},
        "auth": {"existingSecret": "cronoq-tokens"},
        "store": {"postgres": {"urlSecret": {"name": "cronoq-db", "key": "dsn"}, "schema": "jobs_{shard}"}},
        "server": {"metricsPort": 9090},
        "metrics": {"serviceMonitor": {"enabled": True}},
        "config": POOLS,
    },
    # Three shards on a trusted network without TLS, Secrets made by the chart.
    "three-shards-insecure-peer-http-generated-secrets": {
        "shards": THREE_SHARDS,
        "insecurePeerHttp": True,
        "store": {"postgres": {"url": "postgres://db/cronoq"}},
        "metrics": {"serviceMonitor": {"enabled": True}},
        "config": POOLS,
    },
    # Three shards with client certificates required (mTLS), probes on the metrics listener.
    "three-shards-mtls": {
        "shards": THREE_SHARDS,
        "tls": {"secretName": "cronoq-tls", "clientAuth": True},
        "auth": {"existingSecret": "cronoq-tokens"},
        "store": {"postgres": {"urlSecret": {"name": "cronoq-db"}}},
        "server": {"metricsPort": 9464},
        "config": POOLS,
    },
}


def _server_config(objects: list[Obj]) -> str:
    return str(one(objects, "ConfigMap", "prod-cronoq-config")["data"]["cronoq.toml"])


def _units(values: dict[str, Any]) -> list[tuple[str, str, int]]:
    """(object name, shard, replicas) of every server group the values ask for."""
    shards = values.get("shards")
    if not shards:
        return [("prod-cronoq", "", values.get("replicas", 2))]
    return [(f"prod-cronoq-{s['name']}", s["name"], s.get("replicas", values.get("replicas", 2))) for s in shards]


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_chart_lints_and_every_object_is_valid_kubernetes(helm: str, case: str, tmp_path: Path) -> None:
    values = CASES[case]
    lint(helm, CHART, values, tmp_path)
    for version in KUBERNETES_VERSIONS:
        objects = render(helm, CHART, values, kube_version=version, tmp=tmp_path)
        assert validate(objects, versions=[version]) == []


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_shard_has_a_deployment_a_service_and_a_disruption_budget(helm: str, case: str, tmp_path: Path) -> None:
    values = CASES[case]
    objects = render(helm, CHART, values, tmp=tmp_path)
    units = _units(values)
    assert len(find(objects, "Deployment")) == len(find(objects, "PodDisruptionBudget")) == len(units)
    for name, shard, replicas in units:
        deployment = one(objects, "Deployment", name)
        assert deployment["spec"]["replicas"] == replicas
        assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        for kind in ("Service", "PodDisruptionBudget"):
            selector = one(objects, kind, name)["spec"]["selector"]
            selector = selector.get("matchLabels", selector)
            assert selector.items() <= pod_labels.items(), kind
        spread = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"][0]
        assert spread["labelSelector"]["matchLabels"].items() <= pod_labels.items()
        env = {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env.get("CRONOQ_SHARD", {}).get("value", "") == shard
        # Selectors of different shards never overlap.
        others = [n for n, _, _ in units if n != name]
        for other in others:
            other_labels = one(objects, "Deployment", other)["spec"]["template"]["metadata"]["labels"]
            assert not deployment["spec"]["selector"]["matchLabels"].items() <= other_labels.items()
    if values.get("shards"):
        main = one(objects, "Service", "prod-cronoq")["spec"]["selector"]
        for name, _, _ in units:
            pod_labels = one(objects, "Deployment", name)["spec"]["template"]["metadata"]["labels"]
            assert main.items() <= pod_labels.items(), f"the main Service misses {name}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_pods_are_locked_down(helm: str, case: str, tmp_path: Path) -> None:
    values = CASES[case]
    for deployment in find(render(helm, CHART, values, tmp=tmp_path), "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
        container = pod["containers"][0]
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"]["drop"] == ["ALL"]
        assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
        for probe in (container["livenessProbe"], container["readinessProbe"]):
            # Every pod is ready while it runs (the spec's rule), so rolling updates proceed.
            assert probe["httpGet"]["path"] == "/healthz"
            if values.get("server", {}).get("metricsPort"):
                assert probe["httpGet"]["port"] == "metrics" and probe["httpGet"]["scheme"] == "HTTP"
            else:
                assert probe["httpGet"]["port"] == "http"
                assert probe["httpGet"]["scheme"] == ("HTTPS" if values.get("tls") else "HTTP")


@pytest.mark.parametrize("case", sorted(CASES))
def test_tokens_and_the_database_url_come_from_secrets(helm: str, case: str, tmp_path: Path) -> None:
    values = CASES[case]
    objects = render(helm, CHART, values, tmp=tmp_path)
    existing = values.get("auth", {}).get("existingSecret")
    tokens_secret = existing or "prod-cronoq-tokens"
    made = find(objects, "Secret", "prod-cronoq-tokens")
    if existing:
        assert made == []
    else:
        data = {key: base64.b64decode(value).decode() for key, value in made[0]["data"].items()}
        assert sorted(data) == sorted(ROLES)
        assert len(set(data.values())) == 4 and all(len(token) >= 32 for token in data.values())
    postgres = values.get("store", {}).get("kind", "postgres") == "postgres"
    url_secret = values.get("store", {}).get("postgres", {}).get("urlSecret", {})
    for deployment in find(objects, "Deployment"):
        env = {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
        for role in ROLES:
            ref = env[f"CRONOQ_{role.upper()}_TOKEN"]["valueFrom"]["secretKeyRef"]
            assert ref == {"name": tokens_secret, "key": role}
        if postgres:
            ref = env["DATABASE_URL"]["valueFrom"]["secretKeyRef"]
            assert ref == {
                "name": url_secret.get("name") or "prod-cronoq-database",
                "key": url_secret.get("key", "url"),
            }
        assert not [e for e in env.values() if "TOKEN" in e["name"] and "value" in e]  # never inline
    config = _server_config(objects)
    assert "token =" not in config and "postgres://" not in config


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_written_configuration_passes_cronoq_server_check_for_every_shard(
    helm: str, case: str, tmp_path: Path
) -> None:
    values = CASES[case]
    objects = render(helm, CHART, values, tmp=tmp_path)
    text = _server_config(objects)
    path = tmp_path / "cronoq.toml"
    path.write_text(text)
    for _, shard, _ in _units(values):
        args = [sys.executable, "-m", "cronoq.server.main", "--config", path, "--check"]
        done = run([*args, "--shard", shard] if shard else args)
        assert "configuration is valid" in done.stdout
    config = tomllib.loads(text)
    tls = values.get("tls", {})
    shards = config.get("shards", [])
    services = {obj["metadata"]["name"] for obj in find(objects, "Service")}
    for shard in shards:
        scheme, _, rest = shard["endpoint"].partition("://")
        host = rest.split(":")[0]
        assert scheme == ("https" if tls else "http")
        assert host.split(".")[0] in services and host.endswith(".jobs.svc")  # the shard's own Service
    if shards:
        assert "{shard}" in config["store"]["schema"]
        assert config["server"]["insecure_peer_http"] is bool(values.get("insecurePeerHttp"))
    if tls:
        deployment = find(objects, "Deployment")[0]["spec"]["template"]["spec"]
        mounts = {m["name"]: m["mountPath"] for m in deployment["containers"][0]["volumeMounts"]}
        secret = {v["name"]: v.get("secret", {}).get("secretName") for v in deployment["volumes"]}
        assert secret["tls"] == tls["secretName"] and config["server"]["tls"]["cert"].startswith(mounts["tls"])
        assert config["server"]["peer_tls"]["ca"] == f"{mounts['tls']}/ca.crt"
        assert ("client_ca" in config["server"]["tls"]) is bool(tls.get("clientAuth"))


@pytest.mark.parametrize("case", [c for c in sorted(CASES) if CASES[c].get("metrics")])
def test_the_service_monitor_scrapes_each_shard_once_and_labels_its_shard(helm: str, case: str, tmp_path: Path) -> None:
    values = CASES[case]
    objects = render(helm, CHART, values, tmp=tmp_path)
    monitor = one(objects, "ServiceMonitor", "prod-cronoq")["spec"]
    scraped = [
        svc
        for svc in find(objects, "Service")
        if monitor["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    ]
    assert sorted(svc["metadata"]["name"] for svc in scraped) == sorted(name for name, _, _ in _units(values))
    endpoint = monitor["endpoints"][0]
    assert monitor["jobLabel"] == "app.kubernetes.io/name"  # job="cronoq", as the alert rules expect
    assert {"sourceLabels": ["__meta_kubernetes_service_label_cronoq_io_shard"], "targetLabel": "shard"} in endpoint[
        "relabelings"
    ]
    if values.get("server", {}).get("metricsPort"):
        assert endpoint["port"] == "metrics" and "authorization" not in endpoint
    else:
        assert endpoint["port"] == "http"
        assert endpoint["authorization"]["credentials"]["key"] == "metrics"


MEMORY = {"store": {"kind": "memory"}, "replicas": 1}
REFUSED = [
    ({"shards": THREE_SHARDS, "store": {"postgres": {"url": "postgres://db/x"}}}, "tls.secretName"),
    ({"store": {"kind": "postgres"}}, "store.postgres"),
    ({"store": {"kind": "memory"}, "replicas": 2}, "replicas: 1"),
    (
        {"shards": THREE_SHARDS, "insecurePeerHttp": True, "store": {"postgres": {"url": "x", "schema": "cronoq"}}},
        "{shard}",
    ),
    ({**MEMORY, "tls": {"secretName": "t", "clientAuth": True}}, "server.metricsPort"),
    ({**MEMORY, "bogus": 1}, "bogus"),
    ({**MEMORY, "insecurePeerHttp": True, "shards": [{"name": "GPU!", "number": 1, "pools": ["a"]}]}, "shards.0.name"),
    ({**MEMORY, "insecurePeerHttp": True, "shards": [{"name": "a", "number": 256, "pools": ["a"]}]}, "shards.0.number"),
]


@pytest.mark.parametrize(("values", "message"), REFUSED)
def test_values_that_cannot_work_are_refused_naming_the_value(
    helm: str, values: dict[str, Any], message: str, tmp_path: Path
) -> None:
    assert message in render_error(helm, CHART, values, tmp_path)


def test_the_rendered_configuration_runs_a_server_on_postgres(
    helm: str, tmp_path: Path, postgres_dsn: str, pg_schema: str
) -> None:
    """The chart's own tables, as written, start a real server against a real database."""
    values = CASES["one-postgres-generated-secrets"]
    objects = render(helm, CHART, values, tmp=tmp_path)
    tokens = {
        role: base64.b64decode(value).decode()
        for role, value in one(objects, "Secret", "prod-cronoq-tokens")["data"].items()
    }
    config = _server_config(objects)
    # In a pod the listeners bind every interface; here they stay on loopback, and the tables go
    # to a schema of this test's own.
    for before, after in (
        ('"0.0.0.0:7070"', '"127.0.0.1:{port}"'),
        ('"0.0.0.0:7071"', '"127.0.0.1:0"'),
        ('schema = "cronoq"', f'schema = "{pg_schema}"'),
    ):
        assert before in config
        config = config.replace(before, after)
    env = {f"CRONOQ_{role.upper()}_TOKEN": token for role, token in tokens.items()}
    server = ServerProcess(tmp_path, config, env={**env, "DATABASE_URL": postgres_dsn})
    server.start()

    async def submit() -> str:
        async with Client(server.address, token=tokens["client"]) as client:
            return (await client.submit(b"x", pool="llm")).id

    try:
        assert int(asyncio.run(submit())) > 0
    finally:
        server.stop()
