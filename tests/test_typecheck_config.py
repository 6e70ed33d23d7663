"""mypy is strict where the README says it is, run the way ``make test`` runs it.

``scripts/typecheck.py`` checks the package as installed (``cronoq.engine`` is the ``engine/``
folder, ...). These tests give mypy the project's configuration and a small package laid out the
same way, with code strict mode refuses in ``cronoq/engine`` and elsewhere, and check that mypy
refuses it: a configuration naming modules mypy never sees would let it pass. And callers of the
task-option keywords are checked against their one definition.
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
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--no-incremental",
            "-p",
            "cronoq",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    for module in ("engine", "server"):
        path = f"cronoq/{module}/loose.py"
        assert f"{path}:4: error: Function is missing a type annotation  [no-untyped-def]" in run.stdout
        assert f'{path}:9: error: Returning Any from function declared to return "int"  [no-any-return]' in run.stdout


CALLERS = """\
import cronoq
import cronoq.client


async def calls(scheduler: cronoq.Scheduler, client: cronoq.client.Client) -> None:
    await scheduler.submit(1, priority="high", key="k", timeout=2.0)
    await scheduler.submit(1, priorty="high")
    await scheduler.enqueue(1, timeout="soon")
    cronoq.Task(1, tags=3)
    await client.submit(b"", pol="p")
    cronoq.client.task(b"", tenant=5)
"""


def test_task_options_are_checked_at_every_caller(tmp_path: Path) -> None:
    """The one definition of the task options (``TypedDict`` + ``Unpack``) lets mypy check the
    keywords callers pass, by name and by type."""
    tree = _typecheck_script().build_tree()
    probe = tmp_path / "callers.py"
    probe.write_text(CALLERS)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(tmp_path / "cache"),
            str(probe),
        ],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=300,
    )
    errors = [line.split(": error: ", 1)[1] for line in run.stdout.splitlines() if ": error: " in line]
    lines = sorted({int(line.split(":")[1]) for line in run.stdout.splitlines() if ": error: " in line})
    assert lines == [7, 8, 9, 10, 11], run.stdout
    assert any('Unexpected keyword argument "priorty"' in error for error in errors), errors
    assert any('"timeout" to "enqueue"' in error and "float | None" in error for error in errors), errors
    assert any('"tags" to "Task"' in error for error in errors), errors
    assert any('Unexpected keyword argument "pol"' in error for error in errors), errors
    assert any('"tenant" to "task"' in error for error in errors), errors
