"""Checks every submission passes before the engine looks at keys, dependencies or bounds.

``check_values`` bounds every number a spec carries (see ``limits``) and checks its text, so that
nothing admitted can overflow the engine's arithmetic or a store's 64-bit columns later; the
stores run it on recovered rows too. ``check_spec`` adds the resource requests.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol, cast

from . import limits
from .resources import ResourceTable
from .types import AdmissionError, SubmitCode, TaskSpec

_U64_LIMIT = 1 << 64


def _invalid(message: str) -> AdmissionError:
    return AdmissionError(SubmitCode.INVALID, message)


def text_problem(what: str, value: object) -> str | None:
    """Why ``value`` cannot be stored as text (not a string, NUL, lone surrogates), or None."""
    if not isinstance(value, str):
        return f"{what} must be a string"
    if "\0" in value:
        return f"{what} must not contain NUL characters"
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return f"{what} must be valid Unicode text (no unpaired surrogates)"
    return None


def _check_text(what: str, value: object) -> None:
    problem = text_problem(what, value)
    if problem is not None:
        raise _invalid(problem)


def _check_map(what: str, values: Mapping[object, object]) -> None:
    for name, value in values.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise _invalid(f"{what} keys and values must be strings")
        _check_text(f"{what} name", name)
        _check_text(f"{what} {name!r} value", value)


def _check(problem: str | None) -> None:
    if problem is not None:
        raise _invalid(problem)


class _Unchecked(Protocol):
    """A TaskSpec (and the values in it) as a caller may really have built it: any field of any
    type until ``check_values`` has looked at it. Compiled by mypyc (scripts/build_engine.py), a
    read through the declared types would raise a bare TypeError on a wrongly typed field before
    the check could refuse it by name; reads through this view are not type-checked at run time."""

    @property
    def key(self) -> object: ...
    @property
    def pool(self) -> object: ...
    @property
    def kind(self) -> object: ...
    @property
    def tenant(self) -> object: ...
    @property
    def tags(self) -> Mapping[object, object]: ...
    @property
    def labels(self) -> Mapping[object, object]: ...
    @property
    def deadline(self) -> object: ...
    @property
    def duration_hint(self) -> object: ...
    @property
    def timeout(self) -> object: ...
    @property
    def fixed_start(self) -> _Unchecked | None: ...
    @property
    def start(self) -> object: ...
    @property
    def tolerance(self) -> object: ...
    @property
    def retry(self) -> _Unchecked | None: ...
    @property
    def max_attempts(self) -> object: ...
    @property
    def initial_backoff(self) -> object: ...
    @property
    def max_backoff(self) -> object: ...
    @property
    def multiplier(self) -> object: ...
    @property
    def deps(self) -> Iterable[_Unchecked]: ...
    @property
    def target(self) -> object: ...


def check_values(checked: TaskSpec) -> None:
    """Raise AdmissionError (code ``invalid``) when a field is malformed or out of range."""
    spec = cast(_Unchecked, checked)
    # Plain ASCII strings without NUL (nearly all) pass with one test each.
    key = spec.key
    if key is not None and not (type(key) is str and key and key.isascii() and "\0" not in key):
        if key == "":
            raise _invalid("key must not be empty")
        _check_text("key", key)
    pool = spec.pool
    if pool is not None and not (type(pool) is str and pool.isascii() and "\0" not in pool):
        _check_text("pool", pool)
    kind = spec.kind
    if not (type(kind) is str and kind.isascii() and "\0" not in kind):
        _check_text("kind", kind)
    if spec.tenant is not None:
        _check_text("tenant", spec.tenant)
    if spec.tags:
        _check_map("tags", spec.tags)
    if spec.labels:
        _check_map("labels", spec.labels)
    if spec.deadline is not None:
        _check(limits.instant_problem(spec.deadline, "deadline"))
    if spec.duration_hint is not None:
        _check(limits.duration_problem(spec.duration_hint, "duration_hint"))
    if spec.timeout is not None:
        _check(limits.duration_problem(spec.timeout, "timeout", positive=True))
    fixed = spec.fixed_start
    if fixed is not None:
        _check(limits.instant_problem(fixed.start, "start time"))
        _check(limits.duration_problem(fixed.tolerance, "start tolerance"))
    retry = spec.retry
    if retry is not None:
        _check(limits.count_problem(retry.max_attempts, "retry.max_attempts", low=1))
        _check(limits.duration_problem(retry.initial_backoff, "retry.initial_backoff"))
        _check(limits.duration_problem(retry.max_backoff, "retry.max_backoff"))
        _check(limits.factor_problem(retry.multiplier, "retry.multiplier", low=1.0))
    for dep in spec.deps:
        target = dep.target
        if isinstance(target, bool) or not isinstance(target, int | str):
            raise _invalid("a dependency names a task id (int) or key (str)")
        if isinstance(target, str):
            if not target:
                raise _invalid("a dependency key must not be empty")
            _check_text("dependency key", target)
        elif not 0 < target < _U64_LIMIT:
            raise _invalid(f"dependency id {target} is not a task id (an unsigned 64-bit integer)")


def check_spec(spec: TaskSpec, resources: ResourceTable) -> None:
    """Raise AdmissionError when the spec is malformed or names resources it can never get."""
    check_values(spec)
    if spec.resources:
        problem = resources.admission_error(spec.resources)
        if problem is not None:
            raise AdmissionError(problem[0], problem[1])
