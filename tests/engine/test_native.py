"""The compiled engine (mypyc, scripts/build_engine.py) and its pure-Python fallback.

`engine/_native.py` chooses at import: the compiled modules when a build of exactly these sources
is present, the sources otherwise or with `CRONOQ_PURE_PYTHON=1`. Each choice is checked in a
fresh interpreter, as the package is installed here (editable) and as a copy placed elsewhere.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import cronoq.engine
import pytest
from cronoq.engine import _native, actions, views

ENGINE = Path(cronoq.engine.__file__).resolve().parent
STAMP = ENGINE / "_native.digest"
# A build of exactly these sources (`make engine-native` brings it up to date after an edit).
BUILT = STAMP.exists() and STAMP.read_text().strip() == _native.sources_digest(str(ENGINE))

# Prints which engine a fresh interpreter runs: the choice, and the file of every compiled module.
# With an argument, the editable install's finder is left out, so that PYTHONPATH decides (the
# working folder is then the copy's, not the checkout's with its own `cronoq` folder).
_REPORT = """
import importlib, json, pathlib, sys
if len(sys.argv) > 1:
    sys.meta_path = [finder for finder in sys.meta_path if not finder.__module__.startswith("__editable__")]
import cronoq.engine
from cronoq.engine import _native
names = [p.stem for p in pathlib.Path(_native.__file__).parent.glob("*.py") if p.name not in _native.INTERPRETED]
files = {name: importlib.import_module("cronoq.engine." + name).__file__ for name in names}
print(json.dumps({"compiled": _native.COMPILED, "reason": _native.REASON, "files": files}))
"""


def _report(*, pure: bool, path: Path | None = None) -> dict[str, object]:
    env = {key: value for key, value in os.environ.items() if key != _native.PURE_PYTHON_SWITCH}
    if pure:
        env[_native.PURE_PYTHON_SWITCH] = "1"
    command = [sys.executable, "-c", _REPORT]
    if path is not None:
        env["PYTHONPATH"] = str(path)
        command.append("isolated")
    done = subprocess.run(command, env=env, cwd=path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report: dict[str, object] = json.loads(done.stdout)
    report["stderr"] = done.stderr
    return report


def _kinds(report: dict[str, object]) -> set[str]:
    files = report["files"]
    assert isinstance(files, dict) and files
    return {"source" if str(file).endswith(".py") else "extension" for file in files.values()}


def test_the_switch_runs_every_engine_module_from_its_source() -> None:
    report = _report(pure=True)
    assert report["compiled"] is False
    assert _kinds(report) == {"source"}


@pytest.mark.skipif(not BUILT, reason="no current compiled engine here: make engine-native builds one")
def test_a_current_build_runs_every_compiled_module_as_an_extension() -> None:
    report = _report(pure=False)
    assert report["compiled"] is True, report["reason"]
    assert _kinds(report) == {"extension"}


@pytest.mark.skipif(STAMP.exists(), reason="a compiled engine is built here")
def test_without_a_build_the_engine_runs_its_sources() -> None:
    report = _report(pure=False)
    assert report["compiled"] is False
    assert _kinds(report) == {"source"}


@pytest.mark.skipif(not BUILT, reason="no current compiled engine here: make engine-native builds one")
def test_a_build_of_other_sources_is_not_used(tmp_path: Path) -> None:
    # A copy of the package with its build, outside the editable install: used as it is, and no
    # longer once one source differs from what was compiled.
    package = tmp_path / "cronoq"
    package.mkdir()
    (package / "__init__.py").write_text("")
    shutil.copytree(ENGINE, package / "engine", ignore=shutil.ignore_patterns("__pycache__"))
    report = _report(pure=False, path=tmp_path)
    assert report["compiled"] is True, report["reason"]
    assert isinstance(report["files"], dict)
    assert all(str(file).startswith(str(tmp_path)) for file in report["files"].values())
    edited = package / "engine" / "lanes.py"
    edited.write_text(edited.read_text() + "\n# edited after the build\n")
    report = _report(pure=False, path=tmp_path)
    assert report["compiled"] is False
    assert _kinds(report) == {"source"}
    assert "other sources" in str(report["stderr"])


# The classes whose __init__ is written out for mypyc (see actions.py); dataclass keeps them.
_WRITTEN_OUT = (
    actions.StatusEvent,
    actions.TaskRecord,
    actions.PutTask,
    actions.SetStatus,
    actions.Lease,
    actions.Dispatch,
    actions.Abort,
    actions.Resolve,
    actions.RecoveredTask,
    views.Submitted,
)


@pytest.mark.skipif(_native.COMPILED, reason="a compiled __init__ has no signature: checked on the sources")
@pytest.mark.parametrize("cls", _WRITTEN_OUT, ids=lambda cls: cls.__name__)
def test_a_written_out_init_takes_the_fields_in_order_with_their_defaults(cls: type) -> None:
    # make test runs tests/engine on the sources too (CRONOQ_PURE_PYTHON=1), where this runs.
    fields = [
        (field.name, inspect.Parameter.empty if field.default is dataclasses.MISSING else field.default)
        for field in dataclasses.fields(cls)
    ]
    parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
    assert [(parameter.name, parameter.default) for parameter in parameters] == fields
