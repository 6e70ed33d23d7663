"""No module reaches into another module's private members.

A name with a leading underscore is private to the module that defines it. In the project's
packages (``PACKAGES``; tests and load tests are not checked) the rule has two halves:

- ``from <project module> import _name`` is refused, unless ``_name`` is a module of its own
  (a package may split itself into private modules: ``from . import _rows``);
- an attribute access ``x._name`` is refused unless ``x`` is ``self`` or ``cls``, or ``_name`` is
  defined in the same module (a class attribute, a method, an attribute assigned through
  ``self``/``cls``, a ``__slots__`` entry or a module-level name: a class may use the private
  members of another instance of itself, as in ``__eq__``).

Not covered, on purpose: dunder names (``__class__``), enum "sunder" names (``_value_``,
``_name_``), the namedtuple API (``_replace``, ``_asdict``, ``_fields``, ``_make``), and private
names of modules from outside the project (``os._exit``: the standard library's own business).
Generated protobuf modules are not checked.

``KNOWN`` lists the uses that predate this test and are still to be removed, each by module and
name; the test fails when one is no longer needed, so the list only shrinks.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("engine", "stores", "shard", "router", "cluster", "config", "cronoq", "chaos")
NAMEDTUPLE_API = frozenset({"_replace", "_asdict", "_fields", "_make", "_field_defaults"})

# Uses that predate the rule and are still to be removed (none left).
KNOWN: dict[str, frozenset[str]] = {}


def _modules() -> Iterator[Path]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "_pb2" not in path.name:  # generated code
                yield path


def _is_private(name: str) -> bool:
    if not name.startswith("_") or name.startswith("__"):
        return False
    if len(name) > 2 and name.endswith("_"):
        return False  # an enum sunder name
    return name not in NAMEDTUPLE_API


def _is_project(module: str | None, level: int) -> bool:
    return level > 0 or (module or "").split(".")[0] in ("cronoq", *PACKAGES)


def _defined_names(tree: ast.Module) -> set[str]:
    """Every private name the module itself defines."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                names.add(node.attr)
        elif isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__slots__" for target in node.targets
        ):
            for element in ast.walk(node.value):
                if isinstance(element, ast.Constant) and isinstance(element.value, str):
                    names.add(element.value)
    return {name for name in names if _is_private(name)}


def _outside_modules(tree: ast.Module) -> set[str]:
    """Names bound to modules from outside the project (``import os``, ``import numpy as np``)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not _is_project(alias.name, 0):
                    names.add(alias.asname or alias.name.split(".")[0])
    return names


def _is_module(path: Path, module: str | None, level: int, name: str) -> bool:
    """Whether ``from <module> import <name>`` in ``path`` imports a module of the project."""
    if level == 0:
        return False  # absolute imports of private project modules read ``import cronoq._x``
    base = path.parent
    for _ in range(level - 1):
        base = base.parent
    if module:
        base = base.joinpath(*module.split("."))
    return (base / f"{name}.py").exists() or (base / name / "__init__.py").exists()


def violations(path: Path, source: str, shown: Path) -> list[str]:
    tree = ast.parse(source, filename=str(path))
    own = _defined_names(tree)
    outside = _outside_modules(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and _is_project(node.module, node.level):
            for alias in node.names:
                if _is_private(alias.name) and not _is_module(path, node.module, node.level, alias.name):
                    origin = "." * node.level + (node.module or "")
                    found.append(f"{shown}:{node.lineno}: from {origin} import {alias.name}")
        if not isinstance(node, ast.Attribute) or not _is_private(node.attr) or node.attr in own:
            continue
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls", *outside):
            continue
        found.append(f"{shown}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_reaches_into_another_modules_private_members() -> None:
    found: list[str] = []
    used: dict[str, set[str]] = {}
    for path in _modules():
        shown = path.relative_to(ROOT)
        known = KNOWN.get(str(shown), frozenset())
        for violation in violations(path, path.read_text(encoding="utf-8"), shown):
            name = _private_name(violation)
            if name in known:
                used.setdefault(str(shown), set()).add(name)
            else:
                found.append(violation)
    assert not found, "private members used outside their module:\n" + "\n".join(found)
    stale = {module: sorted(names - used.get(module, set())) for module, names in KNOWN.items()}
    assert not any(stale.values()), f"no longer used, remove them from KNOWN: {stale}"


def _private_name(violation: str) -> str:
    """The private name a violation (as ``violations`` words it) is about."""
    return violation.rsplit(" import ", 1)[1] if " import " in violation else violation.rsplit(".", 1)[1]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def f(core):\n    return core._tasks\n", ["core._tasks"]),
        ("def f(core):\n    core._tasks = {}\n", ["core._tasks"]),
        ("class A:\n    def f(self):\n        return self._x\n", []),
        ("class A:\n    def __init__(self):\n        self._x = 1\n\n    def same(self, o):\n        return o._x\n", []),
        ("import os\nos._exit(0)\n", []),
        ("import cronoq.engine\ncronoq.engine._hidden\n", ["cronoq.engine._hidden"]),
        ("from .core import _fault\n", ["from .core import _fault"]),
        ("from cronoq.engine.core import _fault\n", ["from cronoq.engine.core import _fault"]),
        ("from . import _sibling\n", []),
        ("def f(status):\n    return status._value_ + status.__class__.__name__\n", []),
        ("def f(point):\n    return point._replace(x=1)\n", []),
    ],
)
def test_the_rule_itself(tmp_path: Path, source: str, expected: list[str]) -> None:
    (tmp_path / "_sibling.py").write_text("", encoding="utf-8")
    path = tmp_path / "sample.py"
    found = [line.split(": ", 1)[1] for line in violations(path, source, Path(path.name))]
    assert found == expected
