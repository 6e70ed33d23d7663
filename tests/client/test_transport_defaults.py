"""gRPC transport preference: cronoq-server opts in to the poller-thread endpoints; a library
import never changes the application's gRPC settings; workers may opt in explicitly.

Each case runs a fresh interpreter: the setting is process-wide and read by gRPC when its first
channel or server is created.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import grpc

from cronoq.grpc_transport import GRPC_TRANSPORT_EXPERIMENTS

ROOT = Path(__file__).resolve().parents[2]
KNOWN = (1, 60) <= tuple(int(p) for p in grpc.__version__.split(".")[:2]) < (1, 90)


def _experiments_after(script: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    code = f"import os\n{script}\nprint(repr(os.environ.get('GRPC_EXPERIMENTS')))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env={**clean, **env}, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_importing_the_client_changes_nothing() -> None:
    assert _experiments_after("import cronoq.client, cronoq") == repr(None)


def test_a_worker_process_may_opt_in() -> None:
    script = "from cronoq.client import prefer_poller_endpoints\nprint(prefer_poller_endpoints())"
    assert _experiments_after(script) == repr(GRPC_TRANSPORT_EXPERIMENTS if KNOWN else None)


def test_the_applications_own_setting_is_kept_even_when_empty() -> None:
    script = "from cronoq.grpc_transport import prefer_poller_endpoints\nassert not prefer_poller_endpoints()"
    assert _experiments_after(script, GRPC_EXPERIMENTS="") == repr("")
    assert _experiments_after(script, GRPC_EXPERIMENTS="-call_tracer_in_transport") == repr("-call_tracer_in_transport")


def test_the_server_opts_in_before_serving() -> None:
    script = (
        "import cronoq.server.main as m\n"
        "m._run = lambda config: 0\n"  # stop right before serving; the choice is made by then
        "assert m.main([]) == 0"
    )
    assert _experiments_after(script) == repr(GRPC_TRANSPORT_EXPERIMENTS if KNOWN else None)
