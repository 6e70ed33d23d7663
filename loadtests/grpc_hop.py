"""The floor under forwarding: what one extra grpc-aio hop costs on this machine, with no cronoq in it.

Two helper processes of this file, with cronoq-server's gRPC transport settings: a ``backend``
answering ``Tasks.Get`` with a constant, and a ``proxy`` that forwards every ``Get`` to the backend
over one shared channel. ``measure()`` calls
each with the same client, one call at a time (``p50_ms`` / ``p99_ms``) and with 32 in flight
(``calls_per_s``, and the CPU microseconds per call of the process called). The difference
between ``direct`` and ``proxied`` is the price of a hop that no router code can go below;
``shard_scaling.py`` prints it next to its forwarding figures.

Run alone: python loadtests/grpc_hop.py
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_bench import ms, percentile, process_cpu_s

from cronoq.grpc_transport import prefer_poller_endpoints
from cronoq.proto import cronoq_pb2 as pb
from cronoq.proto import cronoq_pb2_grpc as pbg

CONCURRENCY = 32


class _Backend(pbg.TasksServicer):
    async def Get(self, request: pb.GetRequest, context: Any) -> pb.TaskInfo:
        return pb.TaskInfo(id=request.task.id, pool="default")


class _Proxy(pbg.TasksServicer):
    def __init__(self, target: str) -> None:
        self.backend = pbg.TasksStub(grpc.aio.insecure_channel(target))  # type: ignore[no-untyped-call]

    async def Get(self, request: pb.GetRequest, context: Any) -> pb.TaskInfo:
        info: pb.TaskInfo = await self.backend.Get(request, timeout=10)
        return info


async def _serve(mode: str, target: str | None) -> None:
    server = grpc.aio.server()
    pbg.add_TasksServicer_to_server(_Backend() if mode == "backend" else _Proxy(str(target)), server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await server.wait_for_termination()


def _spawn(*args: str) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    return process, f"127.0.0.1:{process.stdout.readline().strip()}"


async def _calls(target: str, pid: int, samples: int, calls: int) -> dict[str, Any]:
    request = pb.GetRequest(task=pb.TaskRef(id=7))
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pbg.TasksStub(channel)  # type: ignore[no-untyped-call]
        for _ in range(50):
            await stub.Get(request)
        latencies = []
        for _ in range(samples):
            started = time.perf_counter()
            await stub.Get(request)
            latencies.append(time.perf_counter() - started)
        gate = asyncio.Semaphore(CONCURRENCY)

        async def one() -> None:
            async with gate:
                await stub.Get(request)

        cpu_before, started = process_cpu_s(pid), time.perf_counter()
        await asyncio.gather(*(one() for _ in range(calls)))
        elapsed = time.perf_counter() - started
        return {
            "p50_ms": ms(percentile(latencies, 0.5)),
            "p99_ms": ms(percentile(latencies, 0.99)),
            "calls_per_s": round(calls / elapsed),
            "cpu_us_per_call": round((process_cpu_s(pid) - cpu_before) * 1e6 / calls),
        }


async def measure(samples: int = 300, calls: int = 2000) -> dict[str, Any]:
    """Figures of calling the backend directly and through the proxy (see the module docstring)."""
    backend, backend_target = _spawn("backend")
    proxy, proxy_target = _spawn("proxy", backend_target)
    try:
        direct = await _calls(backend_target, backend.pid, samples, calls)
        proxied = await _calls(proxy_target, proxy.pid, samples, calls)
    finally:
        for process in (proxy, backend):
            process.kill()
            process.wait()
    return {
        "direct_p50_ms": direct["p50_ms"],
        "proxied_p50_ms": proxied["p50_ms"],
        "hop_p50_ms": round(proxied["p50_ms"] - direct["p50_ms"], 3),
        "direct_calls_per_s": direct["calls_per_s"],
        "proxied_calls_per_s": proxied["calls_per_s"],
        "backend_cpu_us_per_call": direct["cpu_us_per_call"],
        "proxy_cpu_us_per_call": proxied["cpu_us_per_call"],
    }


def _uvloop() -> None:
    try:
        import uvloop
    except ImportError:
        return
    uvloop.install()


if __name__ == "__main__":
    _uvloop()
    if len(sys.argv) > 1 and sys.argv[1] in ("backend", "proxy"):
        prefer_poller_endpoints()  # the transport cronoq-server runs with
        asyncio.run(_serve(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None))
    else:
        print(json.dumps({"bench": "grpc_hop", "case": "bare_hop", **asyncio.run(measure())}))
