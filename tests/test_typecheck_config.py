"""mypy is strict where the README says it is, run the way ``make test`` runs it.

``scripts/typecheck.py`` checks the package as installed (``cronoq.engine`` is the ``engine/``
folder, ...). These tests give mypy the project's configuration and a small package laid out the
same way, with code strict mode refuses in ``cronoq/engine`` and elsewhere, and check that mypy
refuses it: a configuration naming modules mypy never sees would let it pass.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent

LOOSE_CODE = """\
import json


def untyped(value):
    return value


def leaks_any(text: str) -> int:
    return json.loads(text)
"""


def _typecheck_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("typecheck_script", ROOT / "scripts" / "typecheck.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_typecheck_tree_names_each_folder_as_installed() -> None:
    script = _typecheck_script()
    tree = script.build_tree()
    for folder in script.SUBPACKAGES:
        assert os.path.realpath(tree / "cronoq" / folder) == str(ROOT / folder)
    assert os.path.realpath(tree / "cronoq" / "server") == str(ROOT / "cronoq" / "server")


def test_strict_mode_refuses_loose_code_in_the_engine_and_the_rest_of_the_package(tmp_path: Path) -> None:
    package = tmp_path / "cronoq"
    for folder in (package, package / "engine", package / "server"):
        folder.mkdir(exist_ok=True)
        (folder / "__init__.py").write_text("")
    (package / "engine" / "loose.py").write_text(LOOSE_CODE)
    (package / "server" / "loose.py").write_text(LOOSE_CODE)
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "--no-incremental",
         "-p", "cronoq"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 1, run.stdout + run.stderr
    for module in ("engine", "server"):
        path = f"cronoq/{module}/loose.py"
        assert f"{path}:4: error: Function is missing a type annotation  [no-untyped-def]" in run.stdout
        assert f'{path}:9: error: Returning Any from function declared to return "int"  [no-any-return]' in run.stdout
