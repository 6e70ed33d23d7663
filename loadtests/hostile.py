"""What hostile clients cost a ``cronoq-server``: one JSON object per case on stdout,
``{"bench": "hostile", "case": ..., <figures with their unit in the name>}``.

Each run starts one server process (default ``[limits]``, tokens configured, a metrics listener)
and measures, on each listener where it applies:

* ``connection_flood``: 500 connections that never authenticate (each sends the first bytes of a
  request and then nothing): the server's RSS growth while they are open, how many the server
  still holds 2 s in, and the seconds until it has dropped them all.
* ``slowloris``: one HTTP/1.1 request head sent a byte every 0.25 s: seconds until the server
  drops the connection (``header_timeout_s``, 10 s by default), and the status it answered.
* ``rapid_reset``: an HTTP/2 client opening streams and resetting them at once, as fast as it can
  (``tests/server/hostile_clients.py``, in a process of its own), against the gRPC listener and
  the gateway's h2c: latency of normal requests (``Admin.Snapshot`` over gRPC, ``GET
  /v1/snapshot`` over HTTP/1.1) made one after another, in quiet and flood phases that alternate
  (``--rounds`` of each, ``--phase-s`` seconds each), so both are measured under the same load
  of the machine; plus what the attacker managed (resets written, connections, GOAWAYs).

A second server with gRPC-Web on (``[server.grpc_web]``: a front then owns the gRPC port, sorts
connections and copies native gRPC to grpcio) is measured as listener ``grpc+web``: the flood
(half the connections begin native gRPC, half gRPC-Web), slowloris and the rapid reset of native
gRPC through the front (``--no-grpc-web`` leaves it out).

The numbers depend on the machine and on what else runs on it; compare cases of one run only.

    python loadtests/hostile.py [--rounds 3] [--phase-s 4] [--cases connection_flood,slowloris,rapid_reset]
                                [--no-grpc-web]
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from cronoq.proto import cronoq_pb2 as pb  # noqa: E402
from cronoq.proto import cronoq_pb2_grpc as pbg  # noqa: E402
from tests.server.harness import METRICS_TOKEN  # noqa: E402
from tests.server.hostile_clients import PREFACE, slowloris  # noqa: E402
from tests.server.http_support import HttpServerProcess, process_config  # noqa: E402

CONFIG = process_config(metrics=True)
WEB_CONFIG = process_config(extra='\n[server.grpc_web]\nallowed_origins = ["https://console.example"]\n')

FLOOD_CONNECTIONS = 500
FIRST_BYTES = {
    "grpc": PREFACE[:10],
    "http": b"GET /v1/snapshot HTTP/1.1\r\nHost: 127.0.0.1\r\n",
    "metrics": b"GET /m",
    "grpc+web": b"POST /cronoq.v1.Admin/Snapshot HTTP/1.1\r\nHost: 127.0.0.1\r\n",
}


def emit(case: str, **figures: object) -> None:
    print(json.dumps({"bench": "hostile", "case": case, **figures}), flush=True)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def ports(server: HttpServerProcess) -> dict[str, int]:
    return {"grpc": server.port, "http": server.http_port, "metrics": server.metrics_port}


# ----------------------------------------------------------------------------- connection flood


def connection_flood(server: HttpServerProcess, listener: str, port: int) -> None:
    assert server.proc is not None
    pid = server.proc.pid
    before = rss_mib(pid)
    socks = []
    started = time.monotonic()
    for number in range(FLOOD_CONNECTIONS):
        sock = socket.create_connection(("127.0.0.1", port))
        # Through the gRPC-Web front: every other connection begins native gRPC instead.
        first = FIRST_BYTES["grpc"] if listener == "grpc+web" and number % 2 else FIRST_BYTES[listener]
        sock.sendall(first)
        socks.append(sock)
    opened_s = time.monotonic() - started
    time.sleep(2.0)
    peak = rss_mib(pid)
    open_socks = set(socks)
    held_2s = sum(1 for sock in socks if not _closed(sock))
    while open_socks and time.monotonic() - started < 60:
        readable, _, _ = select.select(list(open_socks), [], [], 0.5)
        for sock in readable:
            if _closed(sock):
                open_socks.discard(sock)
        peak = max(peak, rss_mib(pid))
    all_dropped_s = time.monotonic() - started if not open_socks else None
    for sock in socks:
        sock.close()
    emit("connection_flood", listener=listener, connections=FLOOD_CONNECTIONS, open_all_s=round(opened_s, 3),
         rss_before_mib=round(before, 1), rss_growth_mib=round(peak - before, 1), held_after_2s=held_2s,
         all_dropped_after_s=None if all_dropped_s is None else round(all_dropped_s, 1),
         rss_after_mib=round(rss_mib(pid), 1))  # fmt: skip


def _closed(sock: socket.socket) -> bool:
    """Whether the server has closed ``sock`` (what it sent before is read and dropped)."""
    sock.setblocking(False)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        sock.setblocking(True)


# -------------------------------------------------------------------------------- slowloris


def slow_head(listener: str, port: int) -> None:
    dropped_s, answer = slowloris(port, patience_s=120.0)
    status = answer.split(b" ", 2)[1].decode() if answer.startswith(b"HTTP/") else None
    emit("slowloris", listener=listener, dropped_after_s=None if dropped_s is None else round(dropped_s, 2),
         status=status)  # fmt: skip


# ------------------------------------------------------------------------------ rapid reset


def rapid_reset(server: HttpServerProcess, listener: str, rounds: int, phase_s: float) -> None:
    native = listener in ("grpc", "grpc+web")
    if native:
        channel = grpc.insecure_channel(server.address)
        admin = pbg.AdminStub(channel)
        metadata = (("authorization", f"Bearer {METRICS_TOKEN}"),)

        def normal() -> None:
            admin.Snapshot(pb.Empty(), metadata=metadata, timeout=60)

    else:
        request = urllib.request.Request(f"{server.http_url}/v1/snapshot",
                                         headers={"authorization": f"Bearer {METRICS_TOKEN}"})  # fmt: skip

        def normal() -> None:
            with urllib.request.urlopen(request, timeout=60) as answer:
                answer.read()

    normal()
    quiet: list[float] = []
    flood: list[float] = []
    failed = {"quiet": 0, "flood": 0}
    attacker: dict[str, object] = {"resets_sent": 0, "connections": 0, "goaways": {}}
    port = server.port if native else server.http_port
    for _ in range(rounds):
        failed["quiet"] += _timed(normal, phase_s, quiet)
        args = ["--grpc"] if native else []
        # The attacker runs at the lowest priority: on a small machine it would otherwise take the
        # CPU the server and the measuring client need, and measure the machine, not the server.
        attack = subprocess.Popen(["nice", "-n", "19", sys.executable, "-m", "tests.server.hostile_clients",
                                   "rapid-reset", "--port", str(port), "--seconds", str(phase_s + 0.5), *args],
                                  cwd=ROOT, stdout=subprocess.PIPE, text=True)  # fmt: skip
        time.sleep(0.5)  # the flood is on before the first normal request
        failed["flood"] += _timed(normal, phase_s, flood)
        summary = json.loads(attack.communicate(timeout=120)[0])
        attacker["resets_sent"] = int(attacker["resets_sent"]) + summary["resets_sent"]  # type: ignore[call-overload]
        attacker["connections"] = int(attacker["connections"]) + summary["connections"]  # type: ignore[call-overload]
        goaways: dict[str, int] = attacker["goaways"]  # type: ignore[assignment]
        for code, count in summary["goaways"].items():
            goaways[code] = goaways.get(code, 0) + count
    if native:
        channel.close()
    emit("rapid_reset", listener=listener, phase_s=phase_s, rounds=rounds, quiet=_percentiles(quiet),
         flood=_percentiles(flood), failed_requests=failed, attacker_resets_sent=attacker["resets_sent"],
         attacker_connections=attacker["connections"], attacker_goaways_by_code=attacker["goaways"])  # fmt: skip


def _timed(call: Callable[[], None], seconds: float, into: list[float]) -> int:
    failures = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        started = time.monotonic()
        try:
            call()
        except Exception:
            failures += 1
            continue
        into.append(time.monotonic() - started)
    return failures


def _percentiles(latencies: list[float]) -> dict[str, object]:
    if not latencies:
        return {"requests": 0}
    ordered = sorted(latencies)

    def at(share: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(share * len(ordered)))] * 1000, 2)

    return {"requests": len(ordered), "p50_ms": at(0.50), "p99_ms": at(0.99), "max_ms": round(ordered[-1] * 1000, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--phase-s", type=float, default=4.0)
    parser.add_argument("--cases", default="connection_flood,slowloris,rapid_reset")
    parser.add_argument("--no-grpc-web", action="store_true", help="leave out the server with gRPC-Web on")
    args = parser.parse_args()
    cases = set(args.cases.split(","))
    with tempfile.TemporaryDirectory() as directory:
        server = HttpServerProcess(Path(directory), CONFIG, name="hostile").start()
        try:
            listeners = ports(server)
            if "connection_flood" in cases:
                for listener, port in listeners.items():
                    connection_flood(server, listener, port)
            if "slowloris" in cases:
                for listener in ("http", "metrics"):
                    slow_head(listener, listeners[listener])
            if "rapid_reset" in cases:
                for listener in ("grpc", "http"):
                    rapid_reset(server, listener, args.rounds, args.phase_s)
        finally:
            server.stop()
        if args.no_grpc_web:
            return
        web = HttpServerProcess(Path(directory), WEB_CONFIG, name="hostile-web").start()
        try:
            if "connection_flood" in cases:
                connection_flood(web, "grpc+web", web.port)
            if "slowloris" in cases:
                slow_head("grpc+web", web.port)
            if "rapid_reset" in cases:
                rapid_reset(web, "grpc+web", args.rounds, args.phase_s)
        finally:
            web.stop()


if __name__ == "__main__":
    main()
