"""The operator chart (deploy/helm/cronoq-operator) and the CronoqWorkerScaler CRD, rendered by
the real helm and validated against the Kubernetes OpenAPI schemas; the least-privilege
ClusterRole, the operator's configuration and token files, and scalers against the CRD."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from cronoq.operator.settings import parse

from .conftest import DEPLOY, run
from .kube import KUBERNETES_VERSIONS, Obj, find, lint, one, render, render_error, validate

CHART = DEPLOY / "helm" / "cronoq-operator"
CRD = yaml.safe_load((CHART / "crds" / "cronoqworkerscalers.yaml").read_text())
EXAMPLE = [doc for doc in yaml.safe_load_all((CHART / "examples" / "default-workers.yaml").read_text()) if doc]

MAIN = {"name": "main", "url": "http://cronoq.cronoq:7070", "tokenSecret": {"name": "cronoq-tokens", "key": "metrics"}}
GPU = {
    "name": "gpu",
    "url": "https://cronoq-gpu.jobs.svc:7070",
    "tokenSecret": {"name": "gpu-tokens", "key": "m"},
    "caSecret": {"name": "cronoq-tls", "key": "ca.crt"},
}
CASES: dict[str, dict[str, Any]] = {
    "one-server-every-namespace": {"servers": [MAIN]},
    "two-servers-tls-two-namespaces": {"servers": [MAIN, GPU], "namespaces": ["team-a", "team-b"]},
}


def _render(helm: str, values: dict[str, Any], tmp: Path, version: str = KUBERNETES_VERSIONS[-1]) -> list[Obj]:
    objects = render(helm, CHART, values, release="ops", namespace="cronoq-system", kube_version=version, tmp=tmp)
    assert find(objects, "CustomResourceDefinition") == [CRD]  # installed from crds/, before the templates
    return objects


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_chart_and_the_crd_are_valid_kubernetes(helm: str, case: str, tmp_path: Path) -> None:
    lint(helm, CHART, CASES[case], tmp_path)
    for version in KUBERNETES_VERSIONS:
        assert validate(_render(helm, CASES[case], tmp_path, version), versions=[version]) == []


def test_the_example_deployment_and_scaler_are_valid() -> None:
    assert validate(EXAMPLE, crds=[CRD]) == []


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"slotsPerReplica": 0}, "slotsPerReplica"),
        ({"maxReplicas": -1}, "maxReplicas"),
        ({"pool": "no spaces"}, "pool"),
        ({"server": "Main"}, "server"),
        ({"intervalSeconds": 2}, "intervalSeconds"),
        ({"maxReplicas": None}, "maxReplicas"),
    ],
)
def test_the_crd_refuses_scalers_that_cannot_work(change: dict[str, Any], where: str) -> None:
    scaler = copy.deepcopy(EXAMPLE[1])
    scaler["spec"].update(change)
    scaler["spec"] = {key: value for key, value in scaler["spec"].items() if value is not None}
    problems = validate([scaler], crds=[CRD])
    assert len(problems) == 1 and where in problems[0], problems


def test_the_crd_has_a_status_subresource_printer_columns_and_the_bounds_rule() -> None:
    version = CRD["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = {column["name"]: column["jsonPath"] for column in version["additionalPrinterColumns"]}
    assert columns["Desired"] == ".status.desiredSlots" and columns["Replicas"] == ".status.replicas"
    assert columns["Reason"] == ".status.reason"
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["x-kubernetes-validations"][0]["rule"] == "self.minReplicas <= self.maxReplicas"
    defaults = {name: field.get("default") for name, field in spec["properties"].items()}
    assert defaults["slotsPerReplica"] == 1 and defaults["minReplicas"] == 0 and defaults["intervalSeconds"] == 15


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_cluster_role_grants_only_what_the_operator_uses(helm: str, case: str, tmp_path: Path) -> None:
    values = CASES[case]
    objects = _render(helm, values, tmp_path)
    role = one(objects, "ClusterRole", "ops-cronoq-operator")
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert granted == {
        ("cronoq.io", "cronoqworkerscalers", "get"),
        ("cronoq.io", "cronoqworkerscalers", "list"),
        ("cronoq.io", "cronoqworkerscalers", "watch"),
        ("cronoq.io", "cronoqworkerscalers/status", "get"),
        ("cronoq.io", "cronoqworkerscalers/status", "patch"),
        ("cronoq.io", "cronoqworkerscalers/status", "update"),
        ("apps", "deployments/scale", "get"),
        ("apps", "deployments/scale", "patch"),
        ("apps", "deployments/scale", "update"),
    }
    account = {"kind": "ServiceAccount", "name": "ops-cronoq-operator", "namespace": "cronoq-system"}
    namespaces = values.get("namespaces")
    bindings = find(objects, "RoleBinding") if namespaces else find(objects, "ClusterRoleBinding")
    assert sorted(b["metadata"].get("namespace", "*") for b in bindings) == sorted(namespaces or ["*"])
    assert not find(objects, "ClusterRoleBinding" if namespaces else "RoleBinding")
    for binding in bindings:
        assert binding["subjects"] == [account] and binding["roleRef"]["name"] == "ops-cronoq-operator"
    deployment = one(objects, "Deployment", "ops-cronoq-operator")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [args[i + 1] for i, arg in enumerate(args) if arg == "--namespace"] == (namespaces or [])


@pytest.mark.parametrize("case", sorted(CASES))
def test_servers_and_tokens_come_from_the_operators_configuration(helm: str, case: str, tmp_path: Path) -> None:
    values = CASES[case]
    objects = _render(helm, values, tmp_path)
    text = one(objects, "ConfigMap", "ops-cronoq-operator")["data"]["operator.toml"]
    settings = parse(text)
    assert [s["name"] for s in values["servers"]] == list(settings.servers)
    pod = one(objects, "Deployment", "ops-cronoq-operator")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["command"] == ["cronoq-operator"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    files: dict[str, tuple[str, str]] = {}
    for volume in pod["volumes"]:
        for source in volume.get("projected", {}).get("sources", []):
            for item in source["secret"]["items"]:
                files[f"{mounts[volume['name']]}/{item['path']}"] = (source["secret"]["name"], item["key"])
    for server in values["servers"]:
        configured = settings.servers[server["name"]]
        secret = server["tokenSecret"]
        assert files[str(configured.token_file)] == (secret["name"], secret["key"])
        assert configured.url == server["url"]
        if "caSecret" in server:
            assert files[str(configured.ca_file)] == (server["caSecret"]["name"], server["caSecret"]["key"])
    # The API token is mounted (the operator calls the API); the pod is otherwise locked down.
    assert pod["automountServiceAccountToken"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["fsGroup"] == 10001
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert one(objects, "Deployment", "ops-cronoq-operator")["spec"]["strategy"]["type"] == "Recreate"
    path = tmp_path / "operator.toml"
    path.write_text(text)
    assert run([sys.executable, "-m", "cronoq.operator.main", "--config", path, "--check"]).returncode == 0


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({}, "servers"),
        ({"servers": []}, "servers"),
        ({"servers": [MAIN, MAIN]}, "named twice"),
        ({"servers": [{**MAIN, "caSecret": {"name": "t", "key": "ca.crt"}}]}, "only for an https:// url"),
        ({"servers": [{**MAIN, "url": "cronoq:7070"}]}, "servers.0.url"),
        ({"servers": [{**MAIN, "tokenSecret": {"name": "x"}}]}, "key"),
    ],
)
def test_values_that_cannot_work_are_refused(helm: str, values: dict[str, Any], message: str, tmp_path: Path) -> None:
    assert message in render_error(helm, CHART, values, tmp_path)


def test_the_crd_schema_is_a_valid_json_schema() -> None:
    schema = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    jsonschema.Draft7Validator.check_schema(schema)
