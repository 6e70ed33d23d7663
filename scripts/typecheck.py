"""Run mypy on the `cronoq` package as it is installed: the top-level folders mapped into it.

mypy cannot follow setuptools' package-dir mapping, so we lay out a tree of symlinks that looks
like the installed package (cronoq/engine -> engine/, ...) and check that.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUBPACKAGES = ("engine", "stores", "shard", "router", "cluster", "config", "chaos")


def build_tree() -> Path:
    tree = ROOT / "build" / "typecheck"
    pkg = tree / "cronoq"
    pkg.mkdir(parents=True, exist_ok=True)
    wanted = {entry.name: entry for entry in (ROOT / "cronoq").iterdir() if entry.name != "__pycache__"}
    wanted.update({name: ROOT / name for name in SUBPACKAGES})
    for existing in pkg.iterdir():
        stale = existing.name not in wanted or not existing.is_symlink()
        if stale and (existing.is_symlink() or existing.is_file()):
            existing.unlink()
    for name, target in wanted.items():
        link = pkg / name
        if link.is_symlink() and os.readlink(link) == str(target):
            continue
        if link.is_symlink():
            link.unlink()
        link.symlink_to(target)
    return tree


def main() -> int:
    tree = build_tree()
    cmd = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "-p", "cronoq"]
    return subprocess.call(cmd, cwd=tree)


if __name__ == "__main__":
    raise SystemExit(main())
