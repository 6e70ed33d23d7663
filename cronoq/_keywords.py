"""Keyword sets declared once as a ``TypedDict`` and taken as ``**options: Unpack[...]``.

mypy checks the callers' keywords against the ``TypedDict``. At run time such a function would
accept any keyword and show ``**options`` to ``inspect``; ``refuse_unknown`` restores Python's own
error for a keyword that is not in the set, and ``keyword_signature`` restores the published
signature (each option keyword-only, with its default).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ForwardRef, TypeVar

_F = TypeVar("_F", bound=Callable[..., Any])

_NO_DEFAULTS: Mapping[str, object] = {}


def option_names(options_type: type) -> tuple[str, ...]:
    """The keys of a ``TypedDict`` in declaration order."""
    return tuple(options_type.__annotations__)


def refuse_unknown(options: Iterable[str], allowed: frozenset[str], function: str) -> None:
    """Raise the ``TypeError`` Python raises for an unexpected keyword (``function`` as it names it)."""
    for name in options:
        if name not in allowed:
            raise TypeError(f"{function}() got an unexpected keyword argument {name!r}")


def keyword_signature(
    options_type: type, defaults: Mapping[str, object] = _NO_DEFAULTS, *, default: object = None
) -> Callable[[_F], _F]:
    """Give a function taking ``**options: Unpack[options_type]`` the signature it stands for: its
    other parameters, then each key of ``options_type`` as a keyword-only parameter (default
    ``defaults[key]``, else ``default``), in place of ``**options``."""

    def apply(function: _F) -> _F:
        signature = inspect.signature(function)
        keywords = [
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=defaults.get(name, default), annotation=_text(annotation)
            )
            for name, annotation in options_type.__annotations__.items()
        ]
        kept = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        function.__signature__ = signature.replace(parameters=[*kept, *keywords])  # type: ignore[attr-defined]
        return function

    return apply


def _text(annotation: object) -> object:
    """An annotation as the function's own would read (postponed: its source text)."""
    return annotation.__forward_arg__ if isinstance(annotation, ForwardRef) else annotation
