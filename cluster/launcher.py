"""``cronoq cluster up | status | down``: a sharded cluster of real ``cronoq-server`` processes on
this machine, for development, the run command, tests, chaos drills and load tests.

``up`` starts N shards x R replicas. Each shard gets one endpoint (a TCP proxy that follows the
shard's leader, see ``proxy.py``); the replicas listen on free ports of their own, all reading one
configuration file (``--shard``, ``--grpc-addr`` and ``--http-addr`` tell them apart). A replica
that dies while the cluster is up is started again with backoff unless restarts are off (see
``supervisor.py``). State (the configuration, SQLite files, tokens, logs and ``cluster.json``)
lives in the state folder, ``.cronoq/cluster`` by default. Use it as a library too::

    async with Cluster(ClusterOptions(shards=2, replicas=2, state=path, base_port=0)) as cluster:
        client = Client(cluster.shard("s1").plan.grpc_target, token=cluster.token("client"))
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from .layout import (
    DEFAULT_STATE_DIR,
    HOST,
    ROLES,
    URL_ENV,
    ClusterOptions,
    OptionsError,
    Placement,
    ShardPlan,
    pools_of_shard,
    render_config,
    shard_name,
    token_env,
)
from .probe import http_status, process_start_ticks, same_process
from .proxy import LeaderProxy, LeaderWatch, bind_listener
from .replica import Replica, ReplicaError, free_port
from .state import STATE_FILE, ClusterState, ReplicaState, ShardState, StateError
from .supervisor import Supervisor
from .tokens import load_or_create_tokens

__all__ = ["Cluster", "ClusterError", "ReplicaError", "RunningShard", "main"]

CONFIG_FILE = "cluster.toml"
TOKENS_FILE = "tokens.env"
LEADER_TIMEOUT_S = 60.0
STOP_MARGIN_S = 10.0
"""How much longer than ``shutdown_grace_s`` a server gets after SIGTERM before SIGKILL."""


class ClusterError(RuntimeError):
    """The cluster could not be started (or is already running); the message says why."""


class RunningShard:
    """One shard of a started cluster: its plan, its replicas, who leads, and its proxies."""

    def __init__(self, plan: ShardPlan, replicas: list[Replica], watch: LeaderWatch) -> None:
        self.plan = plan
        self.replicas = replicas
        self.watch = watch
        self.proxies: list[LeaderProxy] = []

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def leader(self) -> Replica | None:
        return self.watch.leader

    def replica(self, name: str) -> Replica:
        for replica in self.replicas:
            if replica.name == name:
                return replica
        raise KeyError(name)


def _say(text: str) -> None:
    print(text, flush=True)


class Cluster:
    """Start with ``await start()`` (or ``async with``); stop with ``await stop()``."""

    def __init__(self, options: ClusterOptions, *, say: Callable[[str], None] = _say) -> None:
        options.validate()
        self.options = options
        self.state_dir = Path(options.state).expanduser().resolve()
        self.say = say
        self.shards: list[RunningShard] = []
        self.tokens: dict[str, str] = {}
        self._sockets: dict[str, tuple[socket.socket, socket.socket]] = {}
        self._supervisors: list[Supervisor] = []
        self._started = False
        self._ready = False
        self._owns_state = False

    # ------------------------------------------------------------------------------ queries

    @property
    def config_path(self) -> Path:
        return self.state_dir / CONFIG_FILE

    @property
    def tokens_path(self) -> Path:
        return self.state_dir / TOKENS_FILE

    def token(self, role: str) -> str:
        """The bearer token of ``role`` (client, worker, metrics, admin)."""
        if role not in ROLES:
            raise KeyError(f"unknown role {role!r}; the roles are {', '.join(ROLES)}")
        return self.tokens[token_env(role)]

    def shard(self, name: str) -> RunningShard:
        for shard in self.shards:
            if shard.name == name:
                return shard
        raise KeyError(name)

    def shard_of_pool(self, pool: str) -> RunningShard:
        for shard in self.shards:
            if pool in shard.plan.pools:
                return shard
        raise KeyError(pool)

    @property
    def replicas(self) -> list[Replica]:
        return [replica for shard in self.shards for replica in shard.replicas]

    # ---------------------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> Cluster:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self, leader_timeout: float = LEADER_TIMEOUT_S) -> None:
        """Start every server and proxy; return once every shard has a leader."""
        if self._started:
            raise ClusterError("this cluster was already started")
        self._started = True
        try:
            await self._start(leader_timeout)
        except BaseException:
            await self.stop()
            raise

    async def _start(self, leader_timeout: float) -> None:
        options = self.options
        self._prepare_state_dir()
        self.tokens = load_or_create_tokens(self.tokens_path)
        plans = self._bind_endpoints()
        comment = (
            f"Written by `cronoq cluster up` for {options.shards} shard(s) x {options.replicas} replica(s).\n"
            "Every server of the cluster reads this file, started with --shard NAME and its own\n"
            "--grpc-addr / --http-addr (see logs/). Tokens come from tokens.env."
        )
        # Each replica's ports are chosen now and kept across restarts, so the configuration can
        # list the replicas ([[shards]] replicas) and the console's overview show them.
        taken: set[int] = set()
        ports = {plan.name: [self._replica_ports(plan, taken) for _ in range(options.replicas)] for plan in plans}
        listed = {
            name: [f"http://{self._placement(f'{name}-r{i}').host}:{port}" for i, (port, _) in enumerate(pairs, 1)]
            for name, pairs in ports.items()
        }
        self.config_path.write_text(render_config(options, plans, state_dir=self.state_dir, comment=comment,
                                                  replicas=listed))  # fmt: skip
        env = self._server_env()
        for plan in plans:
            replicas = [
                Replica(
                    plan.name,
                    index,
                    config_path=self.config_path,
                    log_dir=self.state_dir / "logs",
                    env=env,
                    fixed_ports=ports[plan.name][index - 1],
                    host=self._placement(f"{plan.name}-r{index}").host,
                    prefix=self._placement(f"{plan.name}-r{index}").prefix,
                )
                for index in range(1, options.replicas + 1)
            ]
            watch = LeaderWatch(plan.name, replicas, on_change=self._leader_changed(plan.name))
            self.shards.append(RunningShard(plan, replicas, watch))
        where = "Postgres schemas" if options.dsn else f"SQLite files in {self.state_dir}"
        self.say(
            f"starting {len(self.replicas)} cronoq-server processes ({options.shards} shard(s) x "
            f"{options.replicas} replica(s), {where}); logs in {self.state_dir / 'logs'}"
        )
        # Let every start finish (none keeps spawning in the background) before reporting a failure.
        outcomes = await asyncio.gather(*(replica.start() for replica in self.replicas), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        self._supervisors = [
            Supervisor(replica, restart=options.restart, say=self.say, on_restarted=self._replica_restarted)
            for replica in self.replicas
        ]
        for supervisor in self._supervisors:
            supervisor.start()
        for shard in self.shards:
            shard.watch.start()
            if options.proxy:
                await self._start_proxies(shard)
        await self.wait_leaders(leader_timeout)
        self._ready = True
        self._write_state()

    def _prepare_state_dir(self) -> None:
        directory = self.state_dir
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        (directory / "logs").mkdir(exist_ok=True)
        try:
            previous = ClusterState.read(directory)
        except StateError:
            previous = None
        if previous is not None and same_process(previous.pid, previous.start_ticks):
            raise ClusterError(
                f"a cluster is already running from {directory} (pid {previous.pid}); "
                f"stop it with `cronoq cluster down --state {directory}`"
            )
        self._owns_state = True
        self._write_state()  # replaces a stale file; a second `up` on this folder is refused from now on

    def _placement(self, name: str) -> Placement:
        return self.options.placements.get(name) or Placement(HOST)

    def _bind_endpoints(self) -> list[ShardPlan]:
        """Each shard's endpoint ports: bound now by the proxies, or reserved for the servers."""
        plans = []
        for number in range(1, self.options.shards + 1):
            wanted = self.options.endpoint_ports(number)
            host = self._placement(shard_name(number)).host
            if self.options.proxy:
                grpc_sock = self._bind(number, wanted[0], host)
                http_sock = self._bind(number, wanted[1], host)
                self._sockets[shard_name(number)] = (grpc_sock, http_sock)
                grpc_port, http_port = grpc_sock.getsockname()[1], http_sock.getsockname()[1]
            elif wanted == (0, 0):
                grpc_port, http_port = free_port(), free_port()
            else:
                grpc_port, http_port = wanted
            pools = pools_of_shard(number, self.options.pools_per_shard)
            plans.append(ShardPlan(shard_name(number), number, pools, grpc_port, http_port, host))
        return plans

    @staticmethod
    def _bind(number: int, port: int, host: str) -> socket.socket:
        try:
            return bind_listener(port, host)
        except OSError as exc:
            raise ClusterError(
                f"cannot listen on {host}:{port} for shard {shard_name(number)} "
                f"({exc.strerror or exc}); pick another --base-port, or 0 for free ports"
            ) from None

    def _server_env(self) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items() if key not in ("CRONOQ_CONFIG", "CRONOQ_SHARD")}
        env.update(self.tokens)
        env["PYTHONUNBUFFERED"] = "1"
        if self.options.dsn is not None:
            env[URL_ENV] = self.options.dsn
        env.update(self.options.server_env)
        return env

    async def _start_proxies(self, shard: RunningShard) -> None:
        grpc_sock, http_sock = self._sockets[shard.name]
        kinds: tuple[tuple[socket.socket, Callable[[Replica], int], str], ...] = (
            (grpc_sock, _grpc_port, "grpc"),
            (http_sock, _http_port, "http"),
        )
        for sock, port_of, kind in kinds:
            proxy = LeaderProxy(f"{shard.name} {kind}", sock, shard.watch, port_of)
            await proxy.start()
            shard.proxies.append(proxy)

    async def wait_leaders(self, timeout: float = LEADER_TIMEOUT_S) -> None:
        """Return once every shard has a leader; ClusterError naming those without one."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        for shard in self.shards:
            if await shard.watch.wait_leader(max(0.0, deadline - loop.time())) is None:
                missing = [s.name for s in self.shards if s.leader is None]
                dead = [f"{r.name} (exit code {r.returncode}, log {r.log_path})" for r in self.replicas if not r.alive]
                detail = f"; exited: {', '.join(dead)}" if dead else ""
                raise ClusterError(f"no leader within {timeout:.0f}s for shard(s) {', '.join(missing)}{detail}")

    def _leader_changed(self, shard: str) -> Callable[[str | None, str | None], None]:
        def changed(old: str | None, new: str | None) -> None:
            if not self._ready:
                return  # the first leaders; the start-up table shows them
            if new is None:
                self.say(f"shard {shard}: {old} no longer leads; waiting for a standby to take over")
            else:
                self.say(f"shard {shard}: {new} leads now" + ("" if old is None else f" (was {old})"))
            if self._owns_state and self.shards and all(s.leader is not None for s in self.shards):
                self._write_state()

        return changed

    def _replica_ports(self, plan: ShardPlan, taken: set[int]) -> tuple[int, int]:
        """(gRPC, HTTP) ports of one replica: free ones not ``taken`` yet, or the shard's own
        without a proxy."""
        if not self.options.proxy:
            return plan.grpc_port, plan.http_port
        pair: list[int] = []
        while len(pair) < 2:
            port = free_port()
            if port not in taken:
                taken.add(port)
                pair.append(port)
        return pair[0], pair[1]

    def _replica_restarted(self, replica: Replica) -> None:
        # Record the new pid, so `status` and `down` know the process that now runs.
        if self._ready and self._owns_state:
            self._write_state()

    def _write_state(self) -> None:
        shards = tuple(
            ShardState(
                name=shard.name,
                number=shard.plan.number,
                pools=shard.plan.pools,
                endpoint=shard.plan.endpoint,
                http=shard.plan.http_url,
                replicas=tuple(
                    ReplicaState(
                        name=r.name,
                        pid=r.pid or 0,
                        start_ticks=r.start_ticks,
                        grpc_port=r.grpc_port,
                        http_port=r.http_port,
                        log=str(r.log_path),
                        restarts=r.restarts,
                    )
                    for r in shard.replicas
                ),
            )
            for shard in self.shards
        )
        state = ClusterState(
            pid=os.getpid(),
            start_ticks=process_start_ticks(os.getpid()),
            state_dir=str(self.state_dir),
            config=str(self.config_path),
            tokens=str(self.tokens_path),
            store=self.options.store_kind,
            shards=shards,
        )
        state.write(self.state_dir)

    async def stop(self) -> None:
        """Stop proxies, then standbys, then leaders (so no standby takes over just to be
        stopped); SIGKILL any server that outlives its grace period. Idempotent. A cancelled
        caller still gets every server stopped before the cancellation goes on."""
        stopping = asyncio.ensure_future(self._stop())
        try:
            await asyncio.shield(stopping)
        except asyncio.CancelledError:
            await asyncio.gather(stopping, return_exceptions=True)
            raise

    async def _stop(self) -> None:
        # First the supervisors, so no server stopped below is taken for a crash and restarted.
        for supervisor in self._supervisors:
            await supervisor.close()
        self._supervisors.clear()
        for shard in self.shards:
            for proxy in shard.proxies:
                await proxy.close()
            shard.proxies.clear()
            await shard.watch.close()
        for pair in self._sockets.values():
            for sock in pair:
                sock.close()
        self._sockets.clear()
        timeout = self.options.shutdown_grace_s + STOP_MARGIN_S
        leaders = {id(shard.leader) for shard in self.shards if shard.leader is not None}
        standbys = [r for r in self.replicas if id(r) not in leaders]
        await asyncio.gather(*(replica.stop(timeout) for replica in standbys))
        await asyncio.gather(*(replica.stop(timeout) for replica in self.replicas))
        if self._owns_state:
            ClusterState.remove(self.state_dir)
            self._owns_state = False

    # ------------------------------------------------------------------------------ display

    def table(self) -> str:
        rows = [("shard", "pools", "endpoint (gRPC)", "HTTP", "replicas")]
        for shard in self.shards:
            replicas = "  ".join(
                f"{r.name} pid {r.pid} {'LEADER' if r is shard.leader else ('standby' if r.alive else 'down')}"
                + _restarted(r.restarts)
                for r in shard.replicas
            )
            rows.append(
                (
                    f"{shard.name} (#{shard.plan.number})",
                    ",".join(shard.plan.pools),
                    shard.plan.endpoint,
                    shard.plan.http_url,
                    replicas,
                )
            )
        return _format_rows(rows)

    def console_urls(self) -> list[str]:
        """The web console of each shard's HTTP endpoint (none unless ``options.console``)."""
        return [f"{shard.plan.http_url}/ui/" for shard in self.shards] if self.options.console else []

    def summary(self) -> str:
        names = " ".join(token_env(role) for role in ROLES)
        lines = [
            self.table(),
            "",
            f"config: {self.config_path}",
            f"tokens: {names}",
            f"        source {self.tokens_path}",
        ]
        if self.options.console:
            lines.append(f"console: {' '.join(self.console_urls())} (sign in with a token from {self.tokens_path})")
        return "\n".join(lines)


def _restarted(restarts: int) -> str:
    return f" (restarted {restarts}x)" if restarts else ""


def _grpc_port(replica: Replica) -> int:
    return replica.grpc_port


def _http_port(replica: Replica) -> int:
    return replica.http_port


def _format_rows(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    return "\n".join(lines)


# ================================================================================== commands


async def _up(options: ClusterOptions) -> int:
    cluster = Cluster(options)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    starting = asyncio.ensure_future(cluster.start())
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        print("interrupted while starting; every server was stopped", flush=True)
        return 130
    stopping.cancel()
    error = starting.exception()
    if error is not None:
        print(f"cronoq cluster up: {error}", file=sys.stderr, flush=True)
        return 1
    print(cluster.summary(), flush=True)
    restarts = (
        "a server that dies is started again (it rejoins its shard as a standby)"
        if options.restart
        else "a server that dies stays down (--no-restart)"
    )
    print(
        f"\ncluster is up: every shard has a leader; {restarts}. "
        f"`cronoq cluster status --state {cluster.state_dir}`; Ctrl-C (or `cronoq cluster down`) stops it.",
        flush=True,
    )
    await stop.wait()  # meanwhile the supervisors report (and restart) servers that die
    print("stopping every server ...", flush=True)
    await cluster.stop()
    print("stopped", flush=True)
    return 0


def _status(state_dir: Path) -> int:
    try:
        state = ClusterState.read(state_dir)
    except StateError as exc:
        print(f"cronoq cluster status: {exc}", file=sys.stderr)
        return 1
    if state is None:
        print(f"no cluster is running from {state_dir} (no {STATE_FILE})")
        return 1
    if not same_process(state.pid, state.start_ticks):
        print(
            f"the launcher (pid {state.pid}) is gone but left {state_dir / STATE_FILE}; "
            f"`cronoq cluster down --state {state_dir}` cleans up"
        )
        return 1
    if not state.shards:
        print(f"the cluster from {state_dir} is starting (launcher pid {state.pid}); no shard leads yet")
        return 1
    roles = asyncio.run(_probe_roles(state))
    rows = [("shard", "pools", "endpoint (gRPC)", "HTTP", "replicas")]
    leaderless = []
    for shard in state.shards:
        cells = []
        for replica in shard.replicas:
            cells.append(f"{replica.name} pid {replica.pid} {roles[replica.name]}{_restarted(replica.restarts)}")
        if not any(roles[replica.name] == "LEADER" for replica in shard.replicas):
            leaderless.append(shard.name)
        rows.append(
            (f"{shard.name} (#{shard.number})", ",".join(shard.pools), shard.endpoint, shard.http, "  ".join(cells))
        )
    print(f"cluster from {state.state_dir} (launcher pid {state.pid}, store {state.store})")
    print(_format_rows(rows))
    if leaderless:
        print(f"no leader: {', '.join(leaderless)}")
        return 1
    print("every shard has a leader")
    return 0


async def _probe_roles(state: ClusterState) -> dict[str, str]:
    replicas = [replica for shard in state.shards for replica in shard.replicas]

    async def role(replica: ReplicaState) -> str:
        if not same_process(replica.pid, replica.start_ticks):
            return "not running"
        status = await http_status(HOST, replica.http_port, "/readyz")
        if status == 200:
            return "LEADER"
        return "standby" if status is not None else "not answering"

    answers = await asyncio.gather(*(role(replica) for replica in replicas))
    return {replica.name: answer for replica, answer in zip(replicas, answers, strict=True)}


def _down(state_dir: Path, timeout: float) -> int:
    try:
        state = ClusterState.read(state_dir)
    except StateError as exc:
        print(f"cronoq cluster down: {exc}", file=sys.stderr)
        return 1
    if state is None:
        print(f"nothing to stop: no cluster is running from {state_dir}")
        return 0
    servers = [replica for shard in state.shards for replica in shard.replicas]
    if same_process(state.pid, state.start_ticks):
        print(f"stopping the cluster (launcher pid {state.pid}) ...", flush=True)
        os.kill(state.pid, signal.SIGTERM)
        if not _wait_gone([(state.pid, state.start_ticks)], timeout):
            print(f"the launcher did not stop within {timeout:.0f}s; killing it", flush=True)
            with contextlib.suppress(ProcessLookupError):
                os.kill(state.pid, signal.SIGKILL)
    else:
        print(f"the launcher (pid {state.pid}) is gone; stopping what it left running", flush=True)
    left = [(r.pid, r.start_ticks) for r in servers if same_process(r.pid, r.start_ticks)]
    for pid, _ in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    if left and not _wait_gone(left, STOP_MARGIN_S):
        for pid, ticks in left:
            if same_process(pid, ticks):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        _wait_gone(left, 5.0)
    ClusterState.remove(state_dir)
    print(f"stopped: {len(servers)} server(s) of {len(state.shards)} shard(s) are down")
    return 0


def _wait_gone(processes: Sequence[tuple[int, int | None]], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(same_process(pid, ticks) for pid, ticks in processes):
            return True
        time.sleep(0.1)
    return not any(same_process(pid, ticks) for pid, ticks in processes)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cronoq cluster", description="A local sharded cronoq cluster of real server processes."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="{up,status,down}")
    state_help = f"state folder (default: {DEFAULT_STATE_DIR} under the current directory)"

    up = commands.add_parser("up", help="start N shards x R replicas and stay in the foreground until Ctrl-C")
    up.add_argument("--shards", type=int, default=2, help="number of shards (default 2)")
    up.add_argument("--replicas", type=int, default=2, help="servers per shard; one leads (default 2)")
    up.add_argument("--dsn", metavar="URL", help="Postgres URL: one schema per shard (default: SQLite files)")
    up.add_argument("--schema-prefix", default="cronoq_", help="Postgres schemas are PREFIX<shard> (default cronoq_)")
    up.add_argument("--state", type=Path, default=DEFAULT_STATE_DIR, help=state_help)
    up.add_argument(
        "--base-port",
        type=int,
        default=7070,
        help="shard i's gRPC endpoint is BASE+2(i-1), its HTTP endpoint the next port; 0 picks free ports",
    )
    up.add_argument("--console", action="store_true", help="serve the web console at /ui/ of every server")
    up.add_argument(
        "--no-restart",
        dest="restart",
        action="store_false",
        help="leave a server that dies dead (default: start it again, with backoff, as a standby)",
    )

    status = commands.add_parser("status", help="every shard and replica: pid, alive, leader or standby")
    status.add_argument("--state", type=Path, default=DEFAULT_STATE_DIR, help=state_help)

    down = commands.add_parser("down", help="stop a running `up` and its servers")
    down.add_argument("--state", type=Path, default=DEFAULT_STATE_DIR, help=state_help)
    down.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for a graceful stop (default 60)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry of ``cronoq cluster ...`` and ``python -m cronoq.cluster``; returns the exit code."""
    try:
        args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exit_:  # --help, or a usage error argparse has already printed
        return exit_.code if isinstance(exit_.code, int) else 2
    if args.command == "up":
        try:
            options = ClusterOptions(
                shards=args.shards,
                replicas=args.replicas,
                dsn=args.dsn,
                state=args.state,
                base_port=args.base_port,
                schema_prefix=args.schema_prefix,
                restart=args.restart,
                console=args.console,
            )
            options.validate()
        except OptionsError as exc:
            print(f"cronoq cluster up: {exc}", file=sys.stderr)
            return 2
        try:
            return asyncio.run(_up(options))
        except ClusterError as exc:
            print(f"cronoq cluster up: {exc}", file=sys.stderr)
            return 1
    state_dir = Path(args.state).expanduser().resolve()
    if args.command == "status":
        return _status(state_dir)
    return _down(state_dir, args.timeout)
