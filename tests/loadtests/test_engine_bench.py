"""The engine benchmark (``loadtests/engine_bench.py``) runs end to end with tiny counts.

The figures are not judged (the machine is shared); what is checked is that every case reports
them for every backlog, one call per task and batched, with their units.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "loadtests" / "engine_bench.py"


def test_engine_bench_reports_every_case() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--backlogs", "100,1000", "--cycles", "640"],
        cwd=BENCH.parent,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    cycles = {(line["case"], line["calls"], line["backlog"]): line for line in lines if "calls" in line}
    expected = {
        *(("a_mixed_priority", calls, backlog) for calls in ("single", "batched") for backlog in (100, 1000)),
        ("b_deadlines_deps_semaphore", "single", 1000),
        ("b_deadlines_deps_semaphore", "batched", 1000),
    }
    assert set(cycles) == expected, lines
    for line in cycles.values():
        assert line["cycles"] == 640
        assert line["cycles_per_s"] > 0 and line["us_per_cycle"] > 0 and line["cpu_us_per_cycle"] >= 0
    costs = [line for line in lines if line["case"] == "c_dispatch_cost"]
    assert [line["backlog"] for line in costs] == [100, 1000]
    assert all(line["dispatch_us"] > 0 for line in costs)
    (ratio,) = [line for line in lines if line["case"] == "c_dispatch_cost_ratio"]
    assert ratio["backlogs"] == "1000/100" and ratio["ratio"] > 0
