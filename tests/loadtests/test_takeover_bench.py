"""The takeover benchmark (``loadtests/takeover_bench.py``) runs end to end with tiny counts.

Real processes on the test session's Postgres: a leader that is killed, a successor that is then
frozen, and the standby that replaces it. The figures are not judged (the machine is shared);
what is checked is that every case reports them, with their units, and that each new leader
recovered every live task.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "loadtests" / "takeover_bench.py"


def test_takeover_bench_reports_every_case(postgres_dsn: str) -> None:
    args = ["--sizes", "0,500", "--memory", "2000", "--lock-poll", "0.1", "--lease-ttl", "1", "--lease-renew", "0.2"]
    done = subprocess.run(
        [sys.executable, str(BENCH), *args],
        cwd=BENCH.parent,
        env=dict(os.environ, CRONOQ_BENCH_DSN=postgres_dsn),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    by_case = {line["case"]: line for line in lines}
    assert set(by_case) == {"engine_memory_2000", "kill_0", "stop_0", "kill_500", "stop_500"}, lines
    memory = by_case["engine_memory_2000"]
    assert memory["bytes_per_task_traced"] > 0 and "bytes_per_task_rss" in memory
    for live in (0, 500):
        for fault in ("kill", "stop"):
            case = by_case[f"{fault}_{live}"]
            assert "error" not in case, case
            assert case["recovered_tasks"] >= live  # the successor of the first takeover holds one task more
            assert case["takeover_ms"] >= case["acquire_ms"] >= 0
            assert case["first_dispatch_ms"] >= case["takeover_ms"]
            assert case["peak_rss_mib"] > 0 and case["lease_ttl_s"] == 1
    # A frozen leader is replaced only once its lease ran out (renewed at most lease_renew_s
    # before it froze).
    stop = by_case["stop_500"]
    assert stop["acquire_ms"] >= 1000 * (stop["lease_ttl_s"] - stop["lease_renew_s"])
