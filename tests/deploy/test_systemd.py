"""The systemd units (deploy/systemd), checked by systemd's own tools in a scratch root.

The root holds the host's systemd units (for the targets ours refer to), our units, the account
from our sysusers file, and the real cronoq-server entry point where the unit expects it.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from .conftest import DEPLOY, run

SYSTEMD = DEPLOY / "systemd"
HINT = "systemd's tools are needed (systemd-analyze, systemd-sysusers): apt-get install systemd"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    for tool in ("systemd-analyze", "systemd-sysusers"):
        assert shutil.which(tool), HINT
    root = tmp_path / "root"
    units = root / "etc" / "systemd" / "system"
    units.mkdir(parents=True)
    host_units = next(p for p in (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system")) if p.is_dir())
    shutil.copytree(host_units, root / "usr" / "lib" / "systemd" / "system", symlinks=True)
    for name in ("cronoq-server@.service", "cronoq.target"):
        shutil.copy(SYSTEMD / name, units / name)
    binary = root / "opt" / "cronoq" / "bin"
    binary.mkdir(parents=True)
    shutil.copy(Path(sys.executable).parent / "cronoq-server", binary / "cronoq-server")
    run(["systemd-sysusers", f"--root={root}", SYSTEMD / "cronoq.sysusers"])
    return root


def test_the_units_verify_cleanly(root: Path) -> None:
    done = run(["systemd-analyze", "verify", f"--root={root}", "cronoq-server@cpu.service", "cronoq.target"])
    assert done.stderr == "", done.stderr  # unknown keys and bad values are warnings there
    assert "cronoq:x:" in (root / "etc" / "passwd").read_text()


def test_the_server_unit_is_hardened(root: Path) -> None:
    # Exposure 0 (locked down) to 10 (exposed); --threshold counts tenths.
    done = run(
        [
            "systemd-analyze",
            "security",
            "--offline=true",
            f"--root={root}",
            "--threshold=20",
            "--no-pager",
            "cronoq-server@cpu.service",
        ]
    )
    assert "Overall exposure level for cronoq-server@cpu.service: 1." in done.stdout, done.stdout[-500:]


def test_the_instance_example_passes_its_arguments_to_a_real_check() -> None:
    lines = dict(
        line.split("=", 1)
        for line in (SYSTEMD / "instance.env.example").read_text().splitlines()
        if line and not line.startswith("#")
    )
    args = lines["CRONOQ_ARGS"].split()
    done = run(
        [sys.executable, "-m", "cronoq.server.main", "--config", DEPLOY / "cronoq.example.toml", "--check", *args]
    )
    assert "configuration is valid" in done.stdout
    secrets = (SYSTEMD / "cronoq.env.example").read_text()
    for role in ("CLIENT", "WORKER", "METRICS", "ADMIN"):
        assert f"CRONOQ_{role}_TOKEN=" in secrets
