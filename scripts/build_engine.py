"""Compile the engine (`engine/`, installed as `cronoq.engine`) to C extensions with mypyc.

    python scripts/build_engine.py           # build, or do nothing when the build is current
    python scripts/build_engine.py --clean   # remove the compiled modules: pure Python again

With CRONOQ_PURE_PYTHON=1 in the environment it compiles nothing (and the engine ignores a build).

`make venv` runs it after the editable install. The extensions land beside the sources in
`engine/` (git ignores them), so the editable install imports them; `engine/_native.py` decides
at import whether they are used (see there: `CRONOQ_PURE_PYTHON=1`, or a build older than the
sources, means pure Python). Wheels and the container image carry no compiled engine: setuptools
ships only the `.py` files of `cronoq.engine`.

mypy cannot follow setuptools' package-dir mapping (as in scripts/typecheck.py), and mypyc names
a module after its path; so the sources are compiled from a staging tree that lays `engine/` out
as `cronoq/engine/`, which gives every module its installed name.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
import sysconfig
import time
import warnings
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
ENGINE = ROOT / "engine"
BUILD = ROOT / "build" / "mypyc"
# Written last by a successful build: the digest of the sources it compiled (engine/_native.py
# compares it with the sources at import).
STAMP = ENGINE / "_native.digest"
GROUP = "cronoq.engine._native_core"


def native_rules() -> ModuleType:
    """engine/_native.py, loaded as a file: the modules that stay Python and the digest of the
    sources are its own, so the build and the check at import agree. (Loaded outside the package,
    its finder answers for no module; its warning about a stale build is this script's business.)"""
    spec = importlib.util.spec_from_file_location("cronoq_engine_native_rules", ENGINE / "_native.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec.loader.exec_module(module)
    return module


def compiled_sources(interpreted: tuple[str, ...]) -> list[Path]:
    return sorted(path for path in ENGINE.glob("*.py") if path.name not in interpreted)


def built_extensions() -> list[Path]:
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    return sorted(ENGINE.glob(f"*{suffix}"))


def clean() -> None:
    for path in built_extensions():
        path.unlink()
    STAMP.unlink(missing_ok=True)
    shutil.rmtree(BUILD, ignore_errors=True)


def stage(paths: list[Path], interpreted: tuple[str, ...]) -> Path:
    """A tree in which `cronoq/engine/<module>.py` are copies of the sources (mypyc records the
    path it compiled in error messages only, so copies do as well as the files themselves)."""
    tree = BUILD / "src"
    shutil.rmtree(tree, ignore_errors=True)
    package = tree / "cronoq" / "engine"
    package.mkdir(parents=True)
    (tree / "cronoq" / "__init__.py").write_text("")
    for path in [*paths, *(ENGINE / name for name in interpreted)]:
        shutil.copy2(path, package / path.name)
    return tree


def build(paths: list[Path], rules: ModuleType) -> str:
    """Compile ``paths`` and return the digest of the sources compiled (the staged copies: a file
    edited while the build runs makes the build stale, not wrongly current)."""
    # Imported here: `--clean` and the up-to-date check need neither mypy nor setuptools.
    from mypyc.build import mypycify
    from setuptools import Distribution

    tree = stage(paths, rules.INTERPRETED)
    staged = [str(tree / "cronoq" / "engine" / path.name) for path in paths]
    previous = Path.cwd()
    os.chdir(tree)
    try:
        extensions = mypycify(
            [*staged, "--config-file", str(ROOT / "pyproject.toml"), "--no-warn-unused-configs"],
            opt_level="3",
            group_name=GROUP,
            target_dir=str(BUILD / "c"),
        )
        distribution = Distribution(
            {"name": "cronoq-engine-native", "ext_modules": extensions, "package_dir": {"cronoq.engine": str(ENGINE)}}
        )
        command = distribution.get_command_obj("build_ext")
        command.inplace = True
        command.build_temp = str(BUILD / "temp")
        command.parallel = os.cpu_count() or 1
        distribution.run_command("build_ext")
    finally:
        os.chdir(previous)
    return str(rules.sources_digest(str(tree / "cronoq" / "engine")))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clean", action="store_true", help="remove the compiled modules and the build folder")
    args = parser.parse_args()
    if args.clean:
        clean()
        return 0
    rules = native_rules()
    if os.environ.get(rules.PURE_PYTHON_SWITCH, "") not in ("", "0"):
        switch = rules.PURE_PYTHON_SWITCH
        print(f"build_engine: {switch} is set: the engine runs its sources, nothing to compile", file=sys.stderr)
        return 0
    paths = compiled_sources(rules.INTERPRETED)
    digest = rules.sources_digest(str(ENGINE))
    if STAMP.exists() and STAMP.read_text().strip() == digest and len(built_extensions()) == len(paths) + 1:
        print("build_engine: the compiled engine is current", file=sys.stderr)
        return 0
    clean()
    started = time.monotonic()
    try:
        built_from = build(paths, rules)
    except (Exception, SystemExit):
        # No half-built engine is left behind (the sources run without one); the cause is above.
        clean()
        print(
            "build_engine: compiling the engine failed (it needs a C compiler and the Python headers);"
            f" with {rules.PURE_PYTHON_SWITCH}=1 set, make skips it and the engine runs its sources",
            file=sys.stderr,
        )
        return 1
    STAMP.write_text(built_from + "\n")
    print(f"build_engine: compiled {len(paths)} modules in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
