"""The import rules of ``docs/architecture.md``, read from that page and checked on every module.

The page's "Import rules" section holds two tables: which areas each area may import, and which
outside modules an area must not import. This test parses both, places every module of the
``cronoq`` distribution in its area (the most specific listed name), and parses every import
statement of every module (AST: also those inside functions and ``TYPE_CHECKING`` blocks). The
checker is tested on made-up modules too, so a rule it silently stopped enforcing would show.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
PACKAGE = "cronoq"
# Folders at the root installed as subpackages (pyproject's package-dir), and the package itself.
FOLDERS = {
    "cronoq": "cronoq",
    **{name: f"cronoq.{name}" for name in ("engine", "stores", "shard", "router", "cluster", "config", "chaos")},
}
NOTHING = {"-", "\N{EN DASH}"}  # a cell that names no area
GENERATED = re.compile(r"_pb2(_grpc)?\.pyi?$")


@dataclass(frozen=True)
class Rules:
    areas: Mapping[str, tuple[str, ...]]  # area -> the module names it covers
    allowed: Mapping[str, frozenset[str]]  # area -> other areas it may import
    forbidden: Mapping[str, frozenset[str]]  # area -> top-level outside modules it must not import

    def area_of(self, module: str) -> str | None:
        """The area of the most specific listed name covering ``module``; None when only the
        package name itself would (that name covers nothing but the package)."""
        best: tuple[int, str] | None = None
        for area, names in self.areas.items():
            for name in names:
                covers = module == name or (module.startswith(name + ".") and name != PACKAGE)
                if covers and (best is None or len(name) > best[0]):
                    best = (len(name), area)
        return None if best is None else best[1]


@dataclass(frozen=True)
class Violation:
    module: str
    line: int
    imported: str
    why: str

    def __str__(self) -> str:
        return f"{self.module}:{self.line} imports {self.imported}: {self.why}"


# ------------------------------------------------------------------------------ reading the page


def _table_rows(text: str) -> Iterator[list[str]]:
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.lstrip().startswith("|") and not set("".join(cells)) <= set("-: "):
            yield cells


def _names(cell: str) -> list[str]:
    if "`" in cell:
        return re.findall(r"`([^`]+)`", cell)
    return [name.strip() for name in cell.split(",") if name.strip() not in NOTHING]


def parse_rules(doc: str) -> Rules:
    """The rules stated in the "Import rules" section of ``doc`` (Markdown)."""
    section = doc.split("\n## Import rules\n", 1)[1].split("\n## ", 1)[0]
    tables = [block for block in re.split(r"\n\s*\n", section) if block.lstrip().startswith("|")]
    assert len(tables) == 2, "the Import rules section holds two tables"
    areas: dict[str, tuple[str, ...]] = {}
    allowed: dict[str, frozenset[str]] = {}
    header, *rows = _table_rows(tables[0])
    assert header == ["area", "modules", "may import"], header
    for area, modules, imports in rows:
        areas[area] = tuple(_names(modules))
        allowed[area] = frozenset(_names(imports))
    header, *rows = _table_rows(tables[1])
    assert header == ["area", "must not import"], header
    forbidden = {area: frozenset(_names(names)) for area, names in rows}
    unknown = {name for names in [*allowed.values(), forbidden.keys()] for name in names} - areas.keys()
    assert not unknown, f"the rules name areas no row defines: {sorted(unknown)}"
    return Rules(areas, allowed, forbidden)


# ------------------------------------------------------------------------------ reading the code


def imports_of(module: str, source: str, *, is_package: bool) -> Iterator[tuple[int, str]]:
    """``(line, imported module)`` for every import statement in ``source``, relative ones resolved.
    ``from a import b`` yields ``a.b`` (``b`` may be a module) as well as ``a``."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                origin = f"{base}.{node.module}" if node.module else base
            else:
                origin = node.module or ""
            yield node.lineno, origin
            for alias in node.names:
                yield node.lineno, f"{origin}.{alias.name}"


def check(rules: Rules, modules: Mapping[str, tuple[str, bool]]) -> list[Violation]:
    """The violations in ``modules`` (name -> (source, is a package)) of ``rules``."""
    violations: list[Violation] = []
    reported: set[tuple[str, int, str]] = set()
    for module, (source, is_package) in sorted(modules.items()):
        area = rules.area_of(module)
        if area is None:
            violations.append(Violation(module, 0, "-", "the module is in no area of docs/architecture.md"))
            continue
        for line, imported in imports_of(module, source, is_package=is_package):
            top = imported.split(".")[0]
            if top != PACKAGE:
                if top in rules.forbidden.get(area, ()):
                    violations.append(Violation(module, line, imported, f"{area} must not import {top}"))
                continue
            # ``from cronoq.x import name`` also yields ``cronoq.x.name``, in the area of ``cronoq.x``;
            # ``from cronoq import name`` yields ``cronoq.name``, in no area unless ``name`` is a module.
            target = rules.area_of(imported)
            if target is None or target == area or target in rules.allowed[area]:
                continue
            if (module, line, target) not in reported:  # one report per statement and area
                reported.add((module, line, target))
                violations.append(Violation(module, line, imported, f"{area} may not import {target}"))
    return violations


def project_modules() -> dict[str, tuple[str, bool]]:
    """Every module of the distribution, by its installed name (generated protobuf code aside)."""
    found: dict[str, tuple[str, bool]] = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")) if (ROOT / folder).is_dir() else ():
            if GENERATED.search(path.name) or "__pycache__" in path.parts:
                continue
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            is_package = parts[-1] == "__init__"
            name = ".".join([package, *(parts[:-1] if is_package else parts)])
            found[name] = (path.read_text(encoding="utf-8"), is_package)
    return found


# ---------------------------------------------------------------------------------------- tests


@pytest.fixture(scope="module")
def rules() -> Rules:
    return parse_rules(DOC.read_text(encoding="utf-8"))


def test_every_module_keeps_the_import_rules_of_the_architecture_page(rules: Rules) -> None:
    modules = project_modules()
    assert len(modules) > 100 and "cronoq.engine.core" in modules and "cronoq.server.app" in modules
    violations = check(rules, modules)
    assert not violations, "\n".join(map(str, violations))


def test_the_page_states_the_layering(rules: Rules) -> None:
    """The rules the page is read for are there (a table that lost its rows would allow nothing
    to be checked and everything to pass)."""
    assert rules.allowed["engine"] == {"native"} and rules.allowed["native"] == frozenset()
    assert rules.allowed["stores"] == {"engine"}
    assert "router" not in rules.allowed["shard"] and "server" not in rules.allowed["router"]
    assert {"asyncio", "time", "grpc"} <= rules.forbidden["engine"]
    assert rules.area_of("cronoq.engine.core") == "engine" and rules.area_of("cronoq._client.worker") == "client"
    assert rules.area_of("cronoq") == "package" and rules.area_of("cronoq.unlisted") is None


MADE_UP_RULES = """
## Import rules

| area | modules | may import |
|---|---|---|
| low | `cronoq.low` | - |
| mid | `cronoq.mid`, `cronoq._mid_helpers` | low |
| top | `cronoq.top` | mid, low, package |
| package | `cronoq` | low |

| area | must not import |
|---|---|
| low | `asyncio`, `time` |

## Next section
"""


def _made_up(sources: Mapping[str, str]) -> dict[str, tuple[str, bool]]:
    return {name: (source, name in {"cronoq", "cronoq.low", "cronoq.mid"}) for name, source in sources.items()}


def _found(sources: Mapping[str, str]) -> set[tuple[str, str]]:
    violations = check(parse_rules(MADE_UP_RULES), _made_up(sources))
    return {(violation.module, violation.imported) for violation in violations}


BASE = {"cronoq": "", "cronoq.low": "", "cronoq.low.parts": "", "cronoq.mid": "", "cronoq.top": ""}


def test_the_checker_allows_what_the_rules_allow() -> None:
    allowed = {
        **BASE,
        "cronoq.mid.a": "from cronoq.low import parts\nimport cronoq.low.parts\nfrom . import b\n",
        "cronoq.mid.b": "import json\nfrom ..low.parts import thing\n",
        "cronoq._mid_helpers": "from cronoq.mid import a\n",
        "cronoq.top": "from cronoq.mid import a\nimport cronoq\n",
        "cronoq.low.parts": "import math\nfrom cronoq.low import other_name\n",
    }
    assert _found(allowed) == set()


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        ("cronoq.low.parts", "from cronoq.mid import a\n", ("cronoq.low.parts", "cronoq.mid")),  # upward
        ("cronoq.low.parts", "import cronoq.top\n", ("cronoq.low.parts", "cronoq.top")),
        ("cronoq.low.parts", "from ..mid import a\n", ("cronoq.low.parts", "cronoq.mid")),  # relative
        ("cronoq.low.parts", "from .. import mid\n", ("cronoq.low.parts", "cronoq.mid")),  # a module by name
        ("cronoq.low.parts", "def f():\n    import cronoq.mid\n", ("cronoq.low.parts", "cronoq.mid")),  # late
        ("cronoq.low.parts", "if TYPE_CHECKING:\n    from cronoq.top import T\n", ("cronoq.low.parts", "cronoq.top")),
        ("cronoq.mid.a", "from cronoq.top import x\n", ("cronoq.mid.a", "cronoq.top")),  # skips no layer
        ("cronoq.low.parts", "import asyncio\n", ("cronoq.low.parts", "asyncio")),  # outside, forbidden
        ("cronoq.low.parts", "from time import monotonic\n", ("cronoq.low.parts", "time")),
        ("cronoq.low.parts", "import cronoq\n", ("cronoq.low.parts", "cronoq")),  # the package is an area
        ("cronoq.stray", "", ("cronoq.stray", "-")),  # a module in no area
    ],
)
def test_the_checker_finds_each_kind_of_violation(module: str, source: str, expected: tuple[str, str]) -> None:
    assert expected in _found({**BASE, module: source})


def test_reading_the_page_refuses_rules_about_unknown_areas() -> None:
    with pytest.raises(AssertionError, match="no row defines"):
        parse_rules(
            MADE_UP_RULES.replace("| top | `cronoq.top` | mid, low, package |", "| top | `cronoq.top` | middle |")
        )
