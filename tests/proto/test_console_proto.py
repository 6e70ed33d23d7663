"""The committed ``cronoq.console.v1`` modules match what scripts/gen_console_proto.py produces."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_console_modules_are_fresh() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_console_proto.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
