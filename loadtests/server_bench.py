"""cronoq-server benchmark: one JSON object per case on stdout, ``{"bench": "server", ...}``.

Each case starts its own ``cronoq-server`` process (one shard, authentication off, loopback
listeners), ``--workers`` worker processes (``server_worker.py``: a ``cronoq.client.Worker``
with a no-op async handler and ``--slots`` slots each) and drives it from this process:

* ``grpc_submit_batch_1000``: ``--tasks`` tasks sent with ``Client.submit_batch`` in batches of
  1000 by ``--submitters`` concurrent submitters sharing one gRPC channel.
* ``http_single_submit_c64``: ``--http-tasks`` tasks sent one per ``POST /v1/tasks`` by 64
  concurrent aiohttp requests (one connection each).

Figures:

* ``tasks_per_s``: tasks divided by the time from the first submission until ``Snapshot`` (polled
  every 20 ms once everything was submitted) counts them all as succeeded.
* ``p50_ms`` / ``p99_ms``: submit-to-complete latency of a sample (every ``--sample-every``-th
  task carries a key; a ``Watch`` on those keys, opened before the run, reports their terminal
  event): from the moment its submission was sent until this process received the event.
* ``ack_p50_ms`` / ``ack_p99_ms``: how long one submission call (a batch, or one HTTP request)
  took to be answered, i.e. durably committed with the Postgres store.
* ``leases_per_message`` / ``reports_per_message``: how many leases the server's Work stream
  messages carried, and outcomes and heartbeats the workers' messages carried, on average (from
  the server's log; both 1 for workers that do not batch).
* ``wall_s``, and the CPU seconds spent meanwhile by the server process (``server_cpu_s``), all
  workers together (``workers_cpu_s``), this load-generating process (``client_cpu_s``) and the
  local Postgres processes (``postgres_cpu_s``; absent when none are visible in /proc), plus
  ``machine_busy_pct``: the share of all CPUs that was busy (from /proc/stat). These say where the
  time went: on a small machine every process competes for the same cores. Each ``<part>_cpu_s``
  also comes as ``<part>_cpu_us_per_task``, which drifts far less between runs than the rates.

Stores: ``postgres`` (the DSN in ``CRONOQ_BENCH_DSN``, default
``postgresql://postgres@127.0.0.1:5432/test``; a fresh schema per case, dropped afterwards with
asyncpg) and ``memory``. An unreachable Postgres is reported as ``{"skipped": ...}``.

This process, the server and the workers run on uvloop when it is installed.

Figures vary by some 20 % from run to run on a small machine; ``--runs R`` repeats each case and
prints the run with the median ``tasks_per_s`` (and ``tasks_per_s_all``).

Run: python loadtests/server_bench.py [--tasks N] [--http-tasks M] [--stores postgres,memory]
     [--cases grpc,http] [--workers W] [--slots S] [--submitters K] [--sample-every E] [--runs R]
     [--py-spy DIR]  (record the server and one worker with py-spy during each case)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import queue
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
ROOT = Path(__file__).resolve().parents[1]
WORKER_SCRIPT = Path(__file__).with_name("server_worker.py")
POOL = "default"
BATCH = 1000
HTTP_CONCURRENCY = 64
POLL_S = 0.02
CASES = {"grpc": "grpc_submit_batch_1000", "http": "http_single_submit_c64"}
CLK_TCK = os.sysconf("SC_CLK_TCK")


def emit(**fields: Any) -> None:
    print(json.dumps({"bench": "server", **fields}), flush=True)


def dsn() -> str:
    return os.environ.get("CRONOQ_BENCH_DSN", DEFAULT_DSN)


def child_env() -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("CRONOQ_CONFIG", None)
    env.pop("CRONOQ_SHARD", None)
    return env


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))]


def ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


# ---------------------------------------------------------------------------------------------
# CPU accounting from /proc


def process_cpu_s(pid: int) -> float:
    """User plus system CPU seconds of one process (all its threads); 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def postgres_pids() -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/comm") as f:
                    if f.read().strip() in ("postgres", "postmaster"):
                        pids.append(int(entry))
            except OSError:
                continue
    return pids


def machine_ticks() -> tuple[int, int]:
    """(busy, total) jiffies over all CPUs."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    total = sum(values[:8])  # guest time is already counted in user time
    return total - idle, total


class Usage:
    """CPU use of the server, the workers, this process and local Postgres between start and stop."""

    def __init__(self, server_pid: int, worker_pids: list[int]) -> None:
        self.server_pid = server_pid
        self.worker_pids = worker_pids

    def _sample(self) -> dict[str, Any]:
        own = resource.getrusage(resource.RUSAGE_SELF)
        return {
            "server": process_cpu_s(self.server_pid),
            "workers": sum(process_cpu_s(pid) for pid in self.worker_pids),
            "client": own.ru_utime + own.ru_stime,
            "postgres": {pid: process_cpu_s(pid) for pid in postgres_pids()},
            "machine": machine_ticks(),
        }

    def start(self) -> None:
        self.before = self._sample()

    def stop(self) -> dict[str, Any]:
        after = self._sample()
        before = self.before
        out: dict[str, Any] = {
            f"{name}_cpu_s": round(after[name] - before[name], 2) for name in ("server", "workers", "client")
        }
        if after["postgres"]:
            # Backends that started during the run count from zero.
            spent = sum(cpu - before["postgres"].get(pid, 0.0) for pid, cpu in after["postgres"].items())
            out["postgres_cpu_s"] = round(spent, 2)
        busy = after["machine"][0] - before["machine"][0]
        total = after["machine"][1] - before["machine"][1]
        out["machine_busy_pct"] = round(100.0 * busy / max(total, 1), 1)
        out["cpus"] = os.cpu_count()
        return out


# ---------------------------------------------------------------------------------------------
# Processes


class Lines:
    """The stdout lines of a child process, read by a thread as they come."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.queue.put(line.rstrip("\n"))
        self.queue.put(None)

    def wait_for(self, word: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no line with {word!r} within {timeout} s")
            try:
                line = self.queue.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                raise RuntimeError(f"process exited ({self.proc.wait(10)}) before printing {word!r}")
            if word in line:
                return line


def stop_process(proc: subprocess.Popen[str], timeout: float = 15.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


SERVER_TOML = """
[server]
grpc_addr = "127.0.0.1:{grpc_port}"
http_addr = "127.0.0.1:{http_port}"
shutdown_grace_s = 1

{store}

[limits]
max_tasks_per_batch = {batch}
max_pending_total = {pending}
max_pending_per_pool = {pending}
max_concurrent_requests = 4096

[[pools]]
name = "{pool}"
max = 512
autoscale = false
lease_ttl_s = 30
"""


class Server:
    """A ``cronoq-server`` process on random loopback ports (retried if a port is taken)."""

    def __init__(self, workdir: Path, store_toml: str, pending: int) -> None:
        self.workdir = workdir
        self.store_toml = store_toml
        self.pending = pending
        self.proc: subprocess.Popen[str] | None = None
        self.grpc_port = self.http_port = 0
        self.stderr_path = workdir / "server.stderr"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_base(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def start(self) -> Server:
        for _ in range(6):
            self.grpc_port, self.http_port = random.sample(range(20000, 60000), 2)
            config = self.workdir / "server.toml"
            config.write_text(SERVER_TOML.format(
                grpc_port=self.grpc_port, http_port=self.http_port, store=self.store_toml,
                batch=BATCH, pending=self.pending, pool=POOL,
            ))  # fmt: skip
            with open(self.stderr_path, "w") as stderr:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "cronoq.server.main", "--config", str(config)],
                    stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=ROOT, env=child_env(),
                )  # fmt: skip
            try:
                Lines(self.proc).wait_for("listening", 60)
                return self
            except (RuntimeError, TimeoutError) as exc:
                stop_process(self.proc)
                if "Address already in use" in self.stderr():
                    continue
                raise RuntimeError(f"server did not start: {exc}\n{self.stderr()[-2000:]}") from None
        raise RuntimeError("server: no free port found")

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)


class Workers:
    """``count`` worker processes serving ``POOL`` of the server at ``target``."""

    def __init__(self, target: str, count: int, slots: int) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        for n in range(count):
            self.procs.append(subprocess.Popen(
                [sys.executable, str(WORKER_SCRIPT), target, POOL, str(slots), f"bench-{n}"],
                stdout=subprocess.PIPE, stderr=None, text=True, cwd=ROOT, env=child_env(),
            ))  # fmt: skip
        self.lines = [Lines(proc) for proc in self.procs]

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self.procs]

    def wait_registered(self, timeout: float = 60.0) -> None:
        for lines in self.lines:
            lines.wait_for("registered", timeout)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            stop_process(proc, timeout=10)


class Profiler:
    """``py-spy record`` (collapsed stacks, ``DIR/<case>-<name>.txt``) of some processes during
    one case: an investigation aid that needs py-spy, not part of the figures.

    Only the thread holding the GIL is sampled (``--gil``): otherwise time a process spends
    waiting for a core (or for the GIL) on a busy machine is charged to whatever frame waits.
    Native threads (gRPC's event engine) are not seen; compare with the CPU seconds figures."""

    def __init__(self, directory: str | None, case: str, pids: dict[str, int]) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        if directory is None:
            return
        exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        if not os.path.exists(exe):
            print("py-spy is not installed; not profiling", file=sys.stderr)
            return
        os.makedirs(directory, exist_ok=True)
        for name, pid in pids.items():
            out = os.path.join(directory, f"{case}-{name}.txt")
            self.procs.append(subprocess.Popen(
                [exe, "record", "--pid", str(pid), "--format", "raw", "--rate", "100", "--output", out,
                 "--nonblocking", "--gil"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            ))  # fmt: skip

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


# ---------------------------------------------------------------------------------------------
# Load


class Watcher:
    """A ``Watch`` on the sampled keys: when each one's terminal event arrived, and its status."""

    def __init__(self, client: Any, keys: list[str]) -> None:
        self.client = client
        self.keys = keys
        self.arrived: dict[str, float] = {}
        self.status: dict[str, str] = {}
        self.changed = asyncio.Event()
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        async for event in self.client.watch(pools=[POOL], keys=self.keys):
            self.arrived[event.key] = time.perf_counter()
            self.status[event.key] = event.status
            self.changed.set()

    async def wait_for(self, key: str, timeout: float) -> bool:
        deadline = time.perf_counter() + timeout
        while key not in self.arrived:
            if self.task.done():
                self.task.result()  # raises what ended the stream
                raise RuntimeError("the watch stream ended")
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                return False
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), remaining)
        return True

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def warm_up(client: Any, watcher: Watcher, keys: list[str]) -> None:
    """Submit keyed tasks until the watch reports one: the stream is subscribed and workers serve."""
    for key in keys:
        await client.submit(None, pool=POOL, key=key)
        if await watcher.wait_for(key, 2.0):
            return
    raise RuntimeError("no warm-up task completed (are the workers serving?)")


async def succeeded(client: Any) -> int:
    return int((await client.snapshot()).totals.succeeded)


async def wait_succeeded(client: Any, target: int, timeout: float) -> float:
    """Poll the snapshot until ``target`` tasks succeeded; the perf_counter time it was seen."""
    deadline = time.perf_counter() + timeout
    while True:
        snap = await client.snapshot()
        now = time.perf_counter()
        totals = snap.totals
        if totals.succeeded >= target:
            return now
        if now > deadline:
            raise TimeoutError(
                f"only {totals.succeeded} of {target} succeeded after {timeout} s "
                f"(failed {totals.failed}, dead-lettered {totals.dead_lettered}, shed {totals.shed})"
            )
        await asyncio.sleep(POLL_S)


def sample_key(run: str, index: int) -> str:
    return f"{run}-{index}"


async def load_grpc(client: Any, total: int, submitters: int, sampled: Callable[[int], str | None],
                    sent: dict[str, float]) -> list[float]:  # fmt: skip
    """Send ``total`` tasks in batches of ``BATCH`` from ``submitters`` coroutines; the ack times."""
    from cronoq.client import task

    batches: list[tuple[list[Any], list[str]]] = []
    for base in range(0, total, BATCH):
        specs, keys = [], []
        for i in range(base, min(base + BATCH, total)):
            key = sampled(i)
            specs.append(task(i, pool=POOL, key=key))
            if key is not None:
                keys.append(key)
        batches.append((specs, keys))
    work: Iterator[tuple[list[Any], list[str]]] = iter(batches)
    acks: list[float] = []

    async def submitter() -> None:
        for specs, keys in work:
            started = time.perf_counter()
            for key in keys:
                sent[key] = started
            answer = await client.submit_batch(specs)
            acks.append(time.perf_counter() - started)
            if len(answer) != len(specs):
                raise RuntimeError(f"a batch of {len(specs)} was answered with {len(answer)} ids")

    await asyncio.gather(*(submitter() for _ in range(submitters)))
    return acks


async def load_http(base_url: str, total: int, sampled: Callable[[int], str | None],
                    sent: dict[str, float]) -> tuple[list[float], int]:  # fmt: skip
    """``POST /v1/tasks`` once per task, ``HTTP_CONCURRENCY`` at a time; ack times and retries.

    A 429 or 503 (overload) is retried after a short pause and counted; any other failure ends
    the case."""
    import aiohttp

    bodies = []
    for i in range(total):
        body: dict[str, Any] = {"pool": POOL, "payload": i}
        key = sampled(i)
        if key is not None:
            body["key"] = key
        bodies.append((key, json.dumps(body).encode()))
    work = iter(bodies)
    acks: list[float] = []
    retries = 0
    url = f"{base_url}/v1/tasks"
    headers = {"content-type": "application/json"}

    async def submitter(session: aiohttp.ClientSession) -> None:
        nonlocal retries
        for key, data in work:
            while True:
                started = time.perf_counter()
                if key is not None:
                    sent[key] = started
                async with session.post(url, data=data, headers=headers) as response:
                    text = await response.read()
                    status = response.status
                if status == 200:
                    acks.append(time.perf_counter() - started)
                    break
                if status in (429, 503):
                    retries += 1
                    await asyncio.sleep(0.01)
                    continue
                raise RuntimeError(f"POST /v1/tasks answered {status}: {text[:300]!r}")

    connector = aiohttp.TCPConnector(limit=HTTP_CONCURRENCY)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(submitter(session) for _ in range(HTTP_CONCURRENCY)))
    return acks, retries


# ---------------------------------------------------------------------------------------------
# One case


def store_toml(store: str, schema: str | None) -> str:
    if store == "memory":
        return '[store]\nkind = "memory"'
    return f'[store]\nkind = "postgres"\nurl = {json.dumps(dsn())}\nschema = "{schema}"'


async def drop_schema(schema: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(dsn())
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


async def check_postgres() -> str | None:
    """None when the bench database answers, else why not."""
    try:
        import asyncpg

        conn = await asyncio.wait_for(asyncpg.connect(dsn()), 10)
        await conn.close()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


async def run_case(store: str, case: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from cronoq.client import Client

    total = args.tasks if case == "grpc" else args.http_tasks
    run = f"b{uuid.uuid4().hex[:8]}"
    schema = f"bench_{uuid.uuid4().hex[:12]}" if store == "postgres" else None
    case_dir = workdir / f"{store}-{case}"
    case_dir.mkdir(parents=True)
    server = Server(case_dir, store_toml(store, schema), pending=max(2 * total, 1000))
    workers: Workers | None = None
    result: dict[str, Any] = {}
    try:
        server.start()
        assert server.proc is not None
        workers = Workers(server.grpc_target, args.workers, args.slots)
        workers.wait_registered()

        def sampled(i: int) -> str | None:
            return sample_key(run, i) if i % args.sample_every == 0 else None

        sample_keys = [key for key in (sampled(i) for i in range(total)) if key is not None]
        warm_keys = [f"{run}-warm-{n}" for n in range(10)]
        client = Client(server.grpc_target, options=[("grpc.max_receive_message_length", 64 << 20)])
        watcher = Watcher(client, sample_keys + warm_keys)
        try:
            await warm_up(client, watcher, warm_keys)
            baseline = await succeeded(client)
            sent: dict[str, float] = {}
            usage = Usage(server.proc.pid, workers.pids)
            profiler = Profiler(args.py_spy, f"{store}-{CASES[case]}",
                                {"server": server.proc.pid, "worker0": workers.pids[0]})  # fmt: skip
            usage.start()
            started = time.perf_counter()
            retries = None
            if case == "grpc":
                acks = await load_grpc(client, total, args.submitters, sampled, sent)
            else:
                acks, retries = await load_http(server.http_base, total, sampled, sent)
            submitted = time.perf_counter()
            done = await wait_succeeded(client, baseline + total, args.timeout)
            figures = usage.stop()
            profiler.stop()
            # Events of the last samples may still be on their way.
            for key in sample_keys:
                if not await watcher.wait_for(key, max(0.0, 5.0 - (time.perf_counter() - done))):
                    break
            latencies = [watcher.arrived[k] - sent[k] for k in sample_keys if k in watcher.arrived and k in sent]
            not_ok = sum(1 for k in sample_keys if watcher.status.get(k, "succeeded") != "succeeded")
        finally:
            await watcher.close()
            await client.close()
        elapsed = done - started
        result.update(tasks=total, workers=args.workers, slots_per_worker=args.slots)
        if case == "grpc":
            result.update(batch=BATCH, submitters=args.submitters, batches=len(acks))
        else:
            result.update(concurrency=HTTP_CONCURRENCY, requests=len(acks), retried_requests=retries)
        result.update(
            tasks_per_s=round(total / elapsed),
            wall_s=round(elapsed, 3),
            submit_s=round(submitted - started, 3),
            submit_tasks_per_s=round(total / (submitted - started)),
            p50_ms=ms(percentile(latencies, 0.50)) if latencies else None,
            p99_ms=ms(percentile(latencies, 0.99)) if latencies else None,
            max_ms=ms(max(latencies)) if latencies else None,
            latency_samples=len(latencies),
            ack_p50_ms=ms(percentile(acks, 0.50)),
            ack_p99_ms=ms(percentile(acks, 0.99)),
            **figures,
        )
        # The same CPU seconds per task, in µs, part by part (what to compare across runs).
        for name, seconds in figures.items():
            if name.endswith("_cpu_s") and isinstance(seconds, (int, float)):
                result[name.replace("_cpu_s", "_cpu_us_per_task")] = round(seconds * 1e6 / total, 1)
        if not_ok:
            result["samples_not_succeeded"] = not_ok
        return result
    except Exception:
        # The server's own log usually says why (e.g. why it stepped down): keep its tail.
        print(f"server stderr (tail):\n{server.stderr()[-3000:]}", file=sys.stderr, flush=True)
        raise
    finally:
        if workers is not None:
            workers.stop()
        server.stop()
        # The streams' last log lines say how many leases and reports each message carried
        # (``result`` is the dict returned above: filled in here, once the server has written them).
        if result:
            result.update(stream_batching(server.stderr()))
        if schema is not None:
            await drop_schema(schema)


def stream_batching(log: str) -> dict[str, float]:
    """Leases per message and reports per message over every Work stream the server logged."""
    counts = [0, 0, 0, 0]
    for match in re.finditer(r"(\d+) leases in (\d+) messages, (\d+) reports in (\d+) messages", log):
        for index, value in enumerate(match.groups()):
            counts[index] += int(value)
    leases, lease_messages, reports, report_messages = counts
    return {
        "leases_per_message": round(leases / max(lease_messages, 1), 1),
        "reports_per_message": round(reports / max(report_messages, 1), 1),
    }


async def main_async(args: argparse.Namespace) -> None:
    stores = [s for s in args.stores.split(",") if s]
    cases = [c for c in args.cases.split(",") if c]
    for name in stores:
        if name not in ("postgres", "memory"):
            raise SystemExit(f"unknown store {name!r} (postgres, memory)")
    for name in cases:
        if name not in CASES:
            raise SystemExit(f"unknown case {name!r} ({', '.join(CASES)})")
    with tempfile.TemporaryDirectory(prefix="cronoq-server-bench-") as tmp:
        for store in stores:
            if store == "postgres" and (why := await check_postgres()) is not None:
                for case in cases:
                    emit(case=CASES[case], store=store, skipped=f"Postgres at CRONOQ_BENCH_DSN unreachable: {why}")
                continue
            for case in cases:
                runs = []
                try:
                    for n in range(args.runs):
                        runs.append(await run_case(store, case, args, Path(tmp) / f"run{n}"))
                except Exception as exc:
                    emit(case=CASES[case], store=store, error=f"{type(exc).__name__}: {exc}"[-1500:])
                    continue
                runs.sort(key=lambda r: r["tasks_per_s"])
                extra: dict[str, Any] = {}
                if len(runs) > 1:
                    extra = {"runs": len(runs), "tasks_per_s_all": [r["tasks_per_s"] for r in runs]}
                emit(case=CASES[case], store=store, **runs[len(runs) // 2], **extra)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=50_000, help="tasks of the gRPC batch case")
    parser.add_argument("--http-tasks", type=int, default=20_000, help="tasks of the HTTP single-submit case")
    parser.add_argument("--stores", default="postgres,memory")
    parser.add_argument("--cases", default="grpc,http")
    parser.add_argument("--workers", type=int, default=4, help="worker processes")
    parser.add_argument("--slots", type=int, default=64, help="slots of each worker")
    parser.add_argument("--submitters", type=int, default=4, help="concurrent SubmitBatch callers")
    parser.add_argument("--sample-every", type=int, default=100, help="every n-th task is a latency sample")
    parser.add_argument("--runs", type=int, default=1, help="runs per case; the median one is printed")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for completion")
    parser.add_argument("--py-spy", metavar="DIR", default=None, help="py-spy the server and a worker into DIR")
    args = parser.parse_args()
    if os.environ.get("CRONOQ_NO_UVLOOP") != "1":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            uvloop.run(main_async(args))
            return
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
