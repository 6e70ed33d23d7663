"""Rendering charts with the real helm, and checking every object against published schemas.

Kubernetes' own kinds are validated with kubernetes-validate (the OpenAPI schemas of each
Kubernetes release, strict: unknown fields are errors). Prometheus Operator and KEDA objects are
validated with the cloudcoil models generated from those projects' CRDs, round-tripped so that
an unknown field is an error too. cronoq's own CRD instances are validated against the CRD's
openAPIV3Schema.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

from .conftest import run

# The oldest Kubernetes the charts support and the newest kubernetes-validate knows.
KUBERNETES_VERSIONS = ("1.25.0", "1.37.0")

Obj = dict[str, Any]


def render(
    helm: str,
    chart: Path,
    values: Mapping[str, Any],
    *,
    release: str = "prod",
    namespace: str = "jobs",
    kube_version: str = KUBERNETES_VERSIONS[-1],
    tmp: Path,
) -> list[Obj]:
    """``helm template`` of ``chart`` with ``values``; the objects it renders, CRDs included."""
    path = tmp / f"values-{abs(hash(repr(sorted(values.items()))))}.yaml"
    path.write_text(yaml.safe_dump(dict(values)))
    done = run(
        [
            helm,
            "template",
            release,
            chart,
            "--namespace",
            namespace,
            "--kube-version",
            kube_version,
            "--include-crds",
            "--values",
            path,
        ]
    )
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def render_error(helm: str, chart: Path, values: Mapping[str, Any], tmp: Path) -> str:
    """The error of a ``helm template`` that must fail."""
    path = tmp / "refused.yaml"
    path.write_text(yaml.safe_dump(dict(values)))
    done = run([helm, "template", "prod", chart, "--values", path], check=False)
    assert done.returncode != 0, f"helm rendered values it should refuse: {dict(values)}"
    return done.stderr


def lint(helm: str, chart: Path, values: Mapping[str, Any], tmp: Path) -> None:
    path = tmp / "lint.yaml"
    path.write_text(yaml.safe_dump(dict(values)))
    done = run([helm, "lint", "--strict", chart, "--values", path])
    assert "0 chart(s) failed" in done.stdout, done.stdout


def _models() -> dict[tuple[str, str], Any]:
    from cloudcoil.models.keda import v1alpha1 as keda
    from cloudcoil.models.prometheus_operator import v1 as monitoring

    return {
        ("monitoring.coreos.com/v1", "ServiceMonitor"): monitoring.ServiceMonitor,
        ("monitoring.coreos.com/v1", "PrometheusRule"): monitoring.PrometheusRule,
        ("keda.sh/v1alpha1", "ScaledObject"): keda.ScaledObject,
        ("keda.sh/v1alpha1", "TriggerAuthentication"): keda.TriggerAuthentication,
    }


def _pruned(value: Any) -> Any:
    """``value`` without empty maps and lists (a model's dump omits what it was not given)."""
    if isinstance(value, dict):
        kept = {key: _pruned(item) for key, item in value.items()}
        return {key: item for key, item in kept.items() if item not in ({}, [], None)}
    if isinstance(value, list):
        return [_pruned(item) for item in value]
    return value


def validate(
    objects: Iterable[Obj], versions: Sequence[str] = KUBERNETES_VERSIONS, crds: Sequence[Obj] = ()
) -> list[str]:
    """Problems of ``objects`` against their schemas; every object must have one."""
    models = _models()
    own = {}
    for crd in crds:
        for version in crd["spec"]["versions"]:
            key = (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])
            own[key] = version["schema"]["openAPIV3Schema"]
    problems = []
    for obj in objects:
        key = (obj["apiVersion"], obj["kind"])
        where = f"{obj['kind']} {obj['metadata'].get('name')}"
        if key in models:
            model = models[key].model_validate(obj)
            dumped = model.model_dump(by_alias=True, exclude_unset=True, mode="json")
            if _pruned(dumped) != _pruned(obj):
                problems.append(f"{where}: fields the {key[0]} schema does not know: {obj} != {dumped}")
            continue
        if key in own:
            try:
                jsonschema.validate(obj, own[key])
            except jsonschema.ValidationError as error:
                problems.append(f"{where}: {error.message} at {list(error.absolute_path)}")
            continue
        for version in versions:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                problems.append(f"{where} (Kubernetes {version}): {error.message} at {list(error.path)}")
            except kubernetes_validate.SchemaNotFoundError:
                problems.append(f"{where}: no schema for {key} in Kubernetes {version}")
    return problems


def find(objects: Iterable[Obj], kind: str, name: str | None = None) -> list[Obj]:
    return [obj for obj in objects if obj["kind"] == kind and (name is None or obj["metadata"]["name"] == name)]


def one(objects: Iterable[Obj], kind: str, name: str) -> Obj:
    found = find(objects, kind, name)
    assert len(found) == 1, f"{len(found)} {kind} named {name}"
    return found[0]
