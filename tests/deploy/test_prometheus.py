"""Alert rules, the Grafana dashboard and the KEDA examples, checked with the real promtool and
against the series a real cronoq-server exports."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cronoq.client import Client, Lease, Worker
from tests.server.harness import CLIENT_TOKEN, METRICS_TOKEN, TOKENS_TOML, WORKER_TOKEN, ServerProcess

from .conftest import DEPLOY, run
from .kube import validate

PROMETHEUS = DEPLOY / "prometheus"
RULES = PROMETHEUS / "cronoq-rules.yaml"
DASHBOARD = json.loads((DEPLOY / "grafana" / "cronoq-dashboard.json").read_text())
KEDA = [doc for path in sorted((DEPLOY / "keda").glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text()) if doc]

SERIES = re.compile(r"\b(cronoq_[a-z0-9_]+|cronoq:[a-z0-9_:]+)")
# Grafana's variables, as a dashboard would fill them in.
GRAFANA = {"$__rate_interval": "5m", "$namespace": ".*", "$shard": ".*", "$pool": ".*"}


def _rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def _dashboard_queries() -> list[str]:
    queries = [target["expr"] for panel in DASHBOARD["panels"] for target in panel.get("targets", [])]
    for variable in DASHBOARD["templating"]["list"]:
        match = (
            re.fullmatch(r"label_values\((.*), \w+\)", variable["query"]["query"])
            if isinstance(variable.get("query"), dict)
            else None
        )
        if match:
            queries.append(match.group(1))
    return queries


def _keda_queries() -> list[str]:
    return [
        trigger["metadata"]["query"]
        for obj in KEDA
        if obj["kind"] == "ScaledObject"
        for trigger in obj["spec"]["triggers"]
        if trigger["type"] == "prometheus"
    ]


def _filled(query: str) -> str:
    for variable, value in GRAFANA.items():
        query = query.replace(variable, value)
    return query


def test_the_rules_pass_promtool_check_and_their_unit_tests(promtool: str) -> None:
    assert "SUCCESS: 13 rules found" in run([promtool, "check", "rules", RULES]).stdout
    done = run([promtool, "test", "rules", "cronoq-rules.test.yaml"], cwd=PROMETHEUS)
    assert "SUCCESS" in done.stdout and "FAILED" not in done.stdout


def test_the_alerts_cover_what_operators_are_paged_for() -> None:
    alerts = {rule["alert"] for rule in _rules() if "alert" in rule}
    assert {
        "CronoqTasksDeadLettered",
        "CronoqWaitAboveObjective",
        "CronoqPendingWithoutWorkers",
        "CronoqShardWithoutLeader",
        "CronoqShardUnavailable",
        "CronoqStoreCommitErrors",
        "CronoqFencedCommits",
    } <= alerts
    for rule in _rules():
        if "alert" in rule:
            assert rule["labels"]["severity"] in ("warning", "critical")
            assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_the_example_scrape_configuration_is_valid(promtool: str, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(METRICS_TOKEN)
    text = (PROMETHEUS / "prometheus.example.yml").read_text()
    assert "/etc/prometheus/cronoq-metrics-token" in text
    (tmp_path / "prometheus.yml").write_text(text.replace("/etc/prometheus/cronoq-metrics-token", str(token)))
    shutil.copy(RULES, tmp_path / RULES.name)
    done = run([promtool, "check", "config", tmp_path / "prometheus.yml"])
    assert "SUCCESS" in done.stdout


def test_every_dashboard_query_is_valid_promql(promtool: str, tmp_path: Path) -> None:
    rules = [{"record": f"dashboard:query_{i}", "expr": _filled(query)} for i, query in enumerate(_dashboard_queries())]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    assert f"SUCCESS: {len(rules)} rules found" in run([promtool, "check", "rules", path]).stdout


def test_the_dashboard_is_well_formed() -> None:
    panels = DASHBOARD["panels"]
    assert DASHBOARD["uid"] == "cronoq-overview" and len({p["id"] for p in panels}) == len(panels)
    variables = {v["name"] for v in DASHBOARD["templating"]["list"]}
    assert variables == {"datasource", "namespace", "shard", "pool"}
    titles = " ".join(p["title"].lower() for p in panels)
    for topic in ("pending", "shard", "wait", "desired vs connected", "cost", "leader"):
        assert topic in titles, topic
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}"
        assert [t["refId"] for t in panel["targets"]] == [chr(65 + i) for i in range(len(panel["targets"]))]
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24


def test_the_keda_query_asks_for_one_pod_per_four_desired_slots(promtool: str, tmp_path: Path) -> None:
    (query,) = _keda_queries()
    tests = {
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {
                        "series": 'cronoq_pool_desired_workers{job="cronoq", pool="default", instance="cpu-0"}',
                        "values": "10 10 13 0",
                    },
                    {
                        "series": 'cronoq_pool_desired_workers{job="cronoq", pool="llm", instance="gpu-0"}',
                        "values": "99 99 99 99",
                    },
                ],
                "promql_expr_test": [
                    {"expr": query, "eval_time": "1m", "exp_samples": [{"labels": "{}", "value": 3}]},
                    {"expr": query, "eval_time": "2m", "exp_samples": [{"labels": "{}", "value": 4}]},
                    {"expr": query, "eval_time": "3m", "exp_samples": [{"labels": "{}", "value": 0}]},
                ],
            }
        ],
    }
    (tmp_path / "keda.test.yaml").write_text(yaml.safe_dump(tests))
    done = run([promtool, "test", "rules", "keda.test.yaml"], cwd=tmp_path)
    assert "SUCCESS" in done.stdout


def test_the_keda_objects_match_keda_and_kubernetes_schemas() -> None:
    kinds = sorted(obj["kind"] for obj in KEDA)
    assert kinds == ["ScaledObject", "ScaledObject", "Secret", "TriggerAuthentication"]
    assert validate(KEDA) == []


@pytest.fixture(scope="module")
def busy_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server that ran tasks on a worker, with more waiting in a pool nobody serves."""
    config = (
        '[server]\ngrpc_addr = "127.0.0.1:{port}"\n'
        + TOKENS_TOML
        + """
[[pools]]
name = "default"
cost_per_worker_second = 0.001
[[pools]]
name = "llm"
max = 8
[[pools]]
name = "other"
"""
    )
    process = ServerProcess(tmp_path_factory.mktemp("metrics-server"), config).start()

    async def traffic() -> None:
        async def echo(lease: Lease) -> bytes:
            return lease.payload

        worker = Worker(process.address, "default", echo, token=WORKER_TOKEN, slots=2)
        running = asyncio.ensure_future(worker.run())
        await worker.wait_registered(20)
        async with Client(process.address, token=CLIENT_TOKEN) as client:
            for _ in range(5):
                await client.submit(b"x", wait=True)
            for _ in range(3):
                await client.submit(b"y", pool="llm")
        await worker.stop(2)
        await running

    asyncio.run(traffic())
    try:
        yield process
    finally:
        process.stop()


def _get(process: ServerProcess, path: str) -> bytes:
    request = urllib.request.Request(
        f"http://127.0.0.1:{process.http_port}{path}", headers={"authorization": f"Bearer {METRICS_TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        body: bytes = response.read()
        return body


def test_every_series_used_is_exported_by_a_real_server(busy_server: ServerProcess) -> None:
    text = _get(busy_server, "/metrics").decode()
    exported = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    recorded = {rule["record"] for rule in _rules() if "record" in rule}
    used: dict[str, set[str]] = {
        "the alert rules": {name for rule in _rules() for name in SERIES.findall(str(rule["expr"]))},
        "the dashboard": {name for query in _dashboard_queries() for name in SERIES.findall(query)},
        "KEDA": {name for query in _keda_queries() for name in SERIES.findall(query)},
    }
    for where, names in used.items():
        assert names, where
        assert names - exported - recorded == set(), f"{where} use series the server does not export"
    # The alerts' own subjects are there, with the labels the rules group by.
    assert 'cronoq_tasks_total{status="dead_lettered"}' in text
    assert re.search(r'cronoq_pool_wait_p90_seconds\{pool="llm"\} ', text)
    assert re.search(r"^cronoq_leader_epoch \d", text, re.MULTILINE)


def test_the_metrics_api_trigger_reads_a_field_the_server_serves(busy_server: ServerProcess) -> None:
    (scaled,) = [
        obj for obj in KEDA if obj["kind"] == "ScaledObject" and obj["spec"]["triggers"][0]["type"] == "metrics-api"
    ]
    metadata = scaled["spec"]["triggers"][0]["metadata"]
    assert metadata["url"].endswith(":7071/v1/snapshot")  # the HTTP port of the chart's Service
    match = re.fullmatch(r'pools\.#\(name=="([^"]+)"\)\.desired', metadata["valueLocation"])
    assert match, metadata["valueLocation"]
    snapshot = json.loads(_get(busy_server, "/v1/snapshot"))
    (pool,) = [pool for pool in snapshot["pools"] if pool["name"] == match.group(1)]
    assert isinstance(pool["desired"], int) and 0 <= pool["desired"] <= 8
