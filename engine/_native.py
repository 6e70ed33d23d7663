"""Whether this process runs the engine compiled by mypyc or its Python sources.

`scripts/build_engine.py` (run by `make venv`) compiles the engine's modules into C extensions
beside their sources and records a digest of the sources it compiled. Python's import system
prefers an extension to a source of the same name, so the choice is made here, once, before the
package's `__init__` imports any engine module:

- `CRONOQ_PURE_PYTHON=1` in the environment: the sources;
- no compiled build (a wheel, the container image, a checkout without `make venv`): the sources;
- a build from other sources than the ones present (an engine file edited or checked out since):
  the sources, with a warning; running the old compiled engine would test code that is not there;
- otherwise the compiled modules.

To run the sources, a finder placed first on `sys.meta_path` answers for every `cronoq.engine`
submodule with a source (or bytecode) loader, so no compiled module is ever imported next to a
pure one. This module and the package's `__init__` are never compiled.
"""

from __future__ import annotations

import hashlib
import os
import sys
import warnings
from collections.abc import Sequence
from importlib.machinery import (
    BYTECODE_SUFFIXES,
    SOURCE_SUFFIXES,
    FileFinder,
    ModuleSpec,
    SourceFileLoader,
    SourcelessFileLoader,
)
from types import ModuleType

PURE_PYTHON_SWITCH = "CRONOQ_PURE_PYTHON"
# Modules that stay Python (scripts/build_engine.py compiles every other one). `__init__` and this
# module run before the choice is made. `types` and `config` hold the values callers build
# (TaskSpec, RetryPolicy, Dep, outcomes, the configurations): compiled, their constructors would
# refuse a wrongly typed field with a TypeError, where the engine's checks refuse it naming the
# field (InvalidRequest, ConfigError), as the published API promises. `cron` parses a caller's
# text off the per-task path (croniter does the work), and its tests count calls by patching it.
INTERPRETED = ("__init__.py", "_native.py", "types.py", "config.py", "cron.py")
_FOLDER = os.path.dirname(os.path.abspath(__file__))
_PACKAGE = __name__.rpartition(".")[0]
_STAMP = os.path.join(_FOLDER, "_native.digest")


def sources_digest(folder: str) -> str:
    """The digest scripts/build_engine.py records: every source's name and contents, in name order
    (the interpreted modules too: compiled code inlines their constants)."""
    digest = hashlib.sha256()
    for name in sorted(os.listdir(folder)):
        if name.endswith(".py"):
            with open(os.path.join(folder, name), "rb") as file:
                digest.update(name.encode() + b"\0" + file.read() + b"\0")
    return digest.hexdigest()


def _choose() -> tuple[bool, str]:
    if os.environ.get(PURE_PYTHON_SWITCH, "") not in ("", "0"):
        return False, f"{PURE_PYTHON_SWITCH} is set"
    try:
        with open(_STAMP) as file:
            built_from = file.read().strip()
    except FileNotFoundError:
        return False, "no compiled build (scripts/build_engine.py makes one)"
    if built_from != sources_digest(_FOLDER):
        reason = "the compiled build is of other sources than these (make venv rebuilds it)"
        warnings.warn(f"cronoq.engine runs its Python sources: {reason}", RuntimeWarning, stacklevel=2)
        return False, reason
    return True, "compiled by scripts/build_engine.py"


class _SourceOnlyFinder:
    """Finds `cronoq.engine` submodules among their sources only, never their extensions."""

    def __init__(self) -> None:
        self._finder = FileFinder(
            _FOLDER, (SourceFileLoader, SOURCE_SUFFIXES), (SourcelessFileLoader, BYTECODE_SUFFIXES)
        )

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if not fullname.startswith(_PACKAGE + "."):
            return None
        return self._finder.find_spec(fullname, target)

    def invalidate_caches(self) -> None:
        self._finder.invalidate_caches()


COMPILED, REASON = _choose()
if not COMPILED and not any(isinstance(finder, _SourceOnlyFinder) for finder in sys.meta_path):
    sys.meta_path.insert(0, _SourceOnlyFinder())
