"""Fixtures for the deployment tests: the real tools, installed by the scripts `make test` uses.

Each tool comes from a script in scripts/ that installs or starts it when it is missing (Docker
and the image, helm, promtool). A script that cannot provide its tool fails the test with the
script's own explanation; nothing is skipped.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def run(
    cmd: Sequence[str | Path],
    *,
    check: bool = True,
    timeout: float = 300.0,
    input: str | None = None,
    env: dict[str, str] | None = None,
    cwd: Path = ROOT,
) -> subprocess.CompletedProcess[str]:
    """Run a command; with ``check`` a failure raises with its output, so the test says why."""
    done = subprocess.run(
        [str(part) for part in cmd],
        capture_output=True,
        text=True,
        timeout=timeout,
        input=input,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )
    if check and done.returncode != 0:
        raise AssertionError(
            f"{' '.join(map(str, cmd))} exited with {done.returncode}\n"
            f"stdout:\n{done.stdout[-4000:]}\nstderr:\n{done.stderr[-4000:]}"
        )
    return done


def tool(script: str, timeout: float = 600.0) -> str:
    """The path a scripts/ensure_*.sh prints on its last line of standard output."""
    done = run(["bash", ROOT / "scripts" / script], timeout=timeout, env={"PYTHON": sys.executable})
    path = done.stdout.strip().splitlines()[-1]
    assert Path(path).is_file(), f"{script} printed {path!r}, which is not a file"
    return path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="session")
def image() -> str:
    """``cronoq:dev`` built from this checkout (scripts/build_image.sh; Docker started if needed)."""
    tag = os.environ.get("CRONOQ_IMAGE", "cronoq:dev")
    run(["bash", ROOT / "scripts" / "build_image.sh"], timeout=1200, env={"PYTHON": sys.executable})
    return tag


@pytest.fixture(scope="session")
def helm() -> str:
    return tool("ensure_helm.sh")


@pytest.fixture(scope="session")
def promtool() -> str:
    return tool("ensure_promtool.sh")
