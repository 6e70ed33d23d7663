"""The peer benchmark (``loadtests/peers``) and the producer benchmark run end to end, with tiny counts.

Real processes throughout: a ``cronoq-server`` and worker processes for cronoq, each peer's own
worker processes, the throwaway Postgres of the test session (each Postgres-based system gets a
database of its own there) and the machine's Redis for the Redis-based peers. The figures are
not judged (the machine is shared); what is checked is that every case completes every task it
submitted, reports its figures with their units, and that the table compares cronoq with each
peer. Peers run when their library is installed (the ``peers`` extra, part of ``test``) and, for
the Redis-based ones, when Redis answers on 127.0.0.1:6379; otherwise the test says which ran.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "loadtests" / "peers" / "bench.py"
PRODUCER = ROOT / "loadtests" / "producer_bench.py"
TINY = ["--tasks", "300", "--sleep-tasks", "200", "--backlog", "500", "--sustain-s", "1", "--workers", "2",
        "--concurrency", "8", "--timeout", "60"]  # fmt: skip
POSTGRES_PEERS = {"pgqueuer": ("pgqueuer",), "procrastinate": ("procrastinate",)}
REDIS_PEERS = {"celery": ("celery",), "dramatiq": ("dramatiq",), "arq": ("arq",)}


def redis_answers() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 6379), timeout=2) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def installed(modules: tuple[str, ...]) -> bool:
    return all(importlib.util.find_spec(name) is not None for name in modules)


def run(script: Path, args: list[str], dsn: str) -> tuple[list[dict[str, Any]], str]:
    env = {**os.environ, "CRONOQ_BENCH_DSN": dsn}
    out = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env,
                         timeout=600, cwd=ROOT)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return lines, out.stdout


def by_case(lines: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(line["case"], line["system"]): line for line in lines}


def assert_complete(result: dict[str, Any]) -> None:
    """The case ran every task it submitted and reported its figures with units."""
    assert "error" not in result and "skipped" not in result, result
    assert not result.get("timed_out") and not result.get("enqueue_timed_out"), result
    case = result["case"]
    if case in ("noop", "sleep10"):
        assert result["tasks_per_s"] > 0
    elif case == "backlog":
        assert result["drain_tasks_per_s"] > 0 and result["enqueue_tasks_per_s"] > 0
    else:
        assert result["latency_samples"] == result["tasks"] > 0
        assert 0 < result["latency_p50_ms"] <= result["latency_p99_ms"] <= result["latency_max_ms"]
    assert result["total_cpu_us_per_task"] > 0
    assert result["durability"]


def test_cronoq_rows_run_every_workload_with_cpu_per_part(postgres_dsn: str) -> None:
    lines, out = run(BENCH, ["--systems", "cronoq,cronoq-inprocess", *TINY], postgres_dsn)
    results = by_case(lines)
    assert set(results) == {(w, s) for w in ("noop", "sleep10", "backlog", "sustained")
                            for s in ("cronoq", "cronoq-inprocess")}  # fmt: skip
    for result in results.values():
        assert_complete(result)
    remote = results[("noop", "cronoq")]
    for part in ("server", "workers", "postgres", "client"):
        assert f"{part}_cpu_us_per_task" in remote, part
    assert "synchronous_commit=on" in remote["durability"] or "synchronous_commit=off" in remote["durability"]
    # Half the no-op rate of the same run is the sustained case's target.
    assert results[("sustained", "cronoq")]["target_tasks_per_s"] == round(0.5 * remote["tasks_per_s"])
    assert out.count("| cronoq | ") == 3 and out.count("| cronoq-inprocess | ") == 3 and "cronoq x: noop" in out


def test_every_available_peer_runs_beside_cronoq(postgres_dsn: str) -> None:
    peers = [name for name, modules in POSTGRES_PEERS.items() if installed(modules)]
    redis_up = redis_answers()
    missing = [name for name, modules in {**POSTGRES_PEERS, **REDIS_PEERS}.items() if not installed(modules)]
    if redis_up:
        peers += [name for name, modules in REDIS_PEERS.items() if installed(modules)]
    not_run = missing + ([] if redis_up else [f"{name} (no Redis on 127.0.0.1:6379)" for name in REDIS_PEERS])
    if not peers:
        pytest.skip(f"only cronoq's side ran: no peer available ({', '.join(not_run)}); pip install -e '.[peers]'")
    if not_run:
        warnings.warn(f"peer benchmark smoke: did not run {', '.join(not_run)}", stacklevel=1)
    # No-op tasks only: the other workloads' code paths are the driver's, shared by every system and
    # covered by cronoq's rows above; each peer's own code (workers, submit, clean-up) runs here.
    lines, out = run(BENCH, ["--systems", ",".join(["cronoq", *peers]), "--workloads", "noop", *TINY], postgres_dsn)
    results = by_case(lines)
    for peer in peers:
        assert_complete(results[("noop", peer)])
        figures, ratios = [[cell.strip() for cell in line.strip("|").split("|")]
                           for line in out.splitlines() if line.startswith(f"| {peer} | ")][:2]  # fmt: skip
        assert ("Redis" if peer in REDIS_PEERS else "Postgres commit (fsync=") in figures[1], figures
        assert figures[2] == f"{results[('noop', peer)]['tasks_per_s']:,}", figures
        # cronoq's no-op ratio to this peer, measured in this run, then the ratio of CPU per task.
        assert (
            ratios[1] == f"{results[('noop', 'cronoq')]['tasks_per_s'] / results[('noop', peer)]['tasks_per_s']:.2f}x"
        )
        assert ratios[2].endswith("x"), ratios


def test_producer_bench_reports_the_cost_of_each_way_to_submit(postgres_dsn: str) -> None:
    lines, _ = run(PRODUCER, ["--single-tasks", "200", "--batch-tasks", "2000", "--wrk-seconds", "1"], postgres_dsn)
    results = {line["case"]: line for line in lines}
    assert set(results) == {"grpc_submit_c64", "grpc_submit_c64_coalesced", "grpc_submit_batch_100",
                            "grpc_submit_batch_1000", "http_submit_c64", "http_wrk_c64"}  # fmt: skip
    wrk = results.pop("http_wrk_c64")
    if shutil.which("wrk") is None:
        assert "wrk is not installed" in wrk["skipped"]
    else:  # every answer was an acknowledgement, each counted once
        assert "error" not in wrk, wrk
        assert wrk["statuses"] == {"200": wrk["tasks"]} and wrk["calls"] == wrk["tasks"] > 0
        assert wrk["tasks"] <= wrk["server_submitted"] <= wrk["tasks"] + wrk["concurrency"]
        assert wrk["server_cpu_us_per_task"] > 0 and wrk["ack_p50_ms"] <= wrk["ack_p99_ms"]
    for case, result in results.items():
        assert "error" not in result, result
        assert result["tasks_per_s"] > 0 and result["ack_p50_ms"] <= result["ack_p99_ms"]
        # CPU comes from /proc in clock ticks (10 ms): a run this small may cost a process none.
        assert result["server_cpu_us_per_task"] >= 0 and result["client_cpu_us_per_task"] >= 0, case
        assert result["shed_tasks"] == 0
    assert sum(result["server_cpu_us_per_task"] for result in results.values()) > 0  # yet measured
    assert results["grpc_submit_c64"]["calls"] == 200 and results["http_submit_c64"]["calls"] == 200
    coalesced = results["grpc_submit_c64_coalesced"]
    assert coalesced["calls"] == 200 and 1 <= coalesced["submit_batch_calls"] < 200
    assert results["grpc_submit_batch_100"]["calls"] == 20 and results["grpc_submit_batch_1000"]["calls"] == 2
