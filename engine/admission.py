"""Checks every submission passes before the engine looks at keys, dependencies or bounds."""

from __future__ import annotations

from collections.abc import Mapping

from .resources import ResourceTable
from .types import AdmissionError, SubmitCode, TaskSpec


def _invalid(message: str) -> AdmissionError:
    return AdmissionError(SubmitCode.INVALID, message)


def _check_text(what: str, value: str) -> None:
    if "\0" in value:
        raise _invalid(f"{what} must not contain NUL characters")


def _check_map(what: str, values: Mapping[str, str]) -> None:
    for name, value in values.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise _invalid(f"{what} keys and values must be strings")
        if "\0" in name or "\0" in value:
            raise _invalid(f"{what} must not contain NUL characters")


def check_spec(spec: TaskSpec, resources: ResourceTable) -> None:
    """Raise AdmissionError when the spec is malformed or names resources it can never get."""
    if spec.key is not None:
        if not spec.key:
            raise _invalid("key must not be empty")
        _check_text("key", spec.key)
    _check_text("kind", spec.kind)
    if spec.tenant is not None:
        _check_text("tenant", spec.tenant)
    if spec.tags:
        _check_map("tags", spec.tags)
    if spec.labels:
        _check_map("labels", spec.labels)
    if spec.duration_hint is not None and spec.duration_hint < 0:
        raise _invalid("duration_hint must not be negative")
    if spec.timeout is not None and spec.timeout <= 0:
        raise _invalid("timeout must be positive")
    fixed = spec.fixed_start
    if fixed is not None and fixed.tolerance < 0:
        raise _invalid("start tolerance must not be negative")
    retry = spec.retry
    if retry is not None:
        if retry.max_attempts < 1:
            raise _invalid("retry.max_attempts must be at least 1")
        if retry.multiplier < 1.0 or retry.initial_backoff < 0 or retry.max_backoff < 0:
            raise _invalid("retry backoff must be non-negative with a multiplier of at least 1")
    for dep in spec.deps:
        target = dep.target
        if isinstance(target, bool) or not isinstance(target, int | str):
            raise _invalid("a dependency names a task id (int) or key (str)")
        if isinstance(target, str):
            if not target:
                raise _invalid("a dependency key must not be empty")
            _check_text("dependency key", target)
    if spec.resources:
        problem = resources.admission_error(spec.resources)
        if problem is not None:
            raise AdmissionError(problem[0], problem[1])
