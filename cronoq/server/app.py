"""The cronoq-server process for one shard: listeners, leadership lifecycle, shutdown.

``ServerApp.run`` binds the gRPC listener at once, as a *standby*: it authenticates callers,
answers UNAVAILABLE and closes each connection about a second after accepting it, so clients
behind a load balancer that spreads connections over replicas retry elsewhere. Meanwhile the
shard service waits for leadership of the store. Once it leads, the standby listener is replaced
by the serving one on the same address. If leadership is lost, workers get
``Shutdown{not_leader}``, connections are closed and the server goes back to standing by.

``stop()`` (SIGTERM/SIGINT) makes a graceful exit: stop admitting, give running attempts
``server.shutdown_grace_s``, tell workers to reconnect elsewhere, release leadership.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from cronoq.cluster.topology import Topology
from cronoq.config import (
    Config,
    MemoryStoreConfig,
    PostgresStoreConfig,
    SqliteStoreConfig,
    WebhookScaler,
    parse_socket_addr,
)
from cronoq.engine import ConfigError, CoreConfig, PoolConfig
from cronoq.router import Router
from cronoq.shard.blob import BlobCodec
from cronoq.shard.driver import DriverOptions
from cronoq.shard.service import ServiceOptions, ShardService
from cronoq.stores.base import SchemaTooNew, ShardMismatch, Store
from cronoq.stores.pool_moves import MoveRow

from . import telemetry
from .api import Api
from .auth import Authenticator
from .convert import core_config
from .forward import ForwardService
from .grpc_service import SHUTDOWN_LINGER_S, GrpcServices, server_options
from .grpc_web import GrpcWebFront
from .http import HttpGateway, ListenError, start_http
from .moves import PoolMoves
from .placements import keeps_placements, placed_config
from .unary import UnaryRunner, time_left

__all__ = ["BindError", "ServerApp", "make_store"]

RELEAD_GRACE_S = 1.0
"""Longest running attempts are given when a leader steps down for a pool move."""
DRAIN_POLL_S = 0.02
"""How often a leader draining a pool for a move looks whether any of its attempts still runs."""

log = logging.getLogger("cronoq.server")


class BindError(Exception):
    """A listener could not bind its address (for example: Address already in use)."""


@dataclass(frozen=True, slots=True)
class Listening:
    """What the process bound, reported once per role change."""

    role: str  # "standby" or "leader"
    grpc: str
    # The HTTP gateway's and the metrics listener's addresses as bound (a port 0 resolved).
    http: str | None = None
    metrics: str | None = None


def make_store(config: Config) -> Store:
    """The store of this server's shard, from ``[store]``, storing payloads and outputs as blobs."""
    section = config.store
    shard = config.server.shard if config.sharded else None
    retention = config.limits.key_retention_s
    if isinstance(section, SqliteStoreConfig):
        from cronoq.stores.sqlite import SqliteStore

        path = config.store_namespace()
        assert path is not None
        return SqliteStore(
            path,
            retention=retention,
            shard=shard,
            codec=BlobCodec(),
            lease_ttl=section.lease_ttl_s,
            lease_renew=section.lease_renew_s,
            lock_poll=section.lock_poll_s,
        )
    if isinstance(section, PostgresStoreConfig):
        from cronoq.stores.postgres import PostgresStore

        if section.url is None:
            raise ValueError("store.url is not known (the environment variable was not read)")
        schema = config.store_namespace() or "public"
        return PostgresStore(
            section.url,
            schema=schema,
            retention=retention,
            shard=shard,
            codec=BlobCodec(),
            lease_ttl=section.lease_ttl_s,
            lease_renew=section.lease_renew_s,
            lock_poll=section.lock_poll_s,
        )
    assert isinstance(section, MemoryStoreConfig)
    from cronoq.stores.memory import MemoryStore

    return MemoryStore(shard=shard, retention=retention, codec=BlobCodec())


def _format_addr(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _bind_problem(host: str, port: int) -> str:
    """Why binding failed, from the OS (grpc only says that it did)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((host, port))
    except OSError as exc:
        return exc.strerror or str(exc)
    return "the address could not be bound"


def _credentials(config: Config) -> grpc.ServerCredentials | None:
    tls = config.server.tls
    if tls is None:
        return None
    with open(tls.cert, "rb") as cert_file, open(tls.key, "rb") as key_file:
        chain, key = cert_file.read(), key_file.read()
    root = None
    if tls.client_ca is not None:
        with open(tls.client_ca, "rb") as ca_file:
            root = ca_file.read()
    return grpc.ssl_server_credentials([(key, chain)], root_certificates=root, require_client_auth=root is not None)


def _keep_finished_s(config: Config) -> float | None:
    section = config.store
    return None if isinstance(section, MemoryStoreConfig) else section.keep_finished_s


class ServerApp:
    def __init__(
        self, config: Config, *, on_listening: Callable[[Listening], None] | None = None, store: Store | None = None
    ) -> None:
        self.config = config
        self.file_config = config
        """The configuration as read; ``config`` is it with the pools the shard's durable placements
        give it, read again at each leadership (``_configure``)."""
        self.api = Api(config)
        # Forwarded calls carry the caller's trace context when OpenTelemetry is on.
        self.router = Router(config, self.api, traceparent=telemetry.outgoing_traceparent, time_left=time_left)
        self.authenticator = Authenticator(config.auth)
        self.store = store if store is not None else make_store(config)
        # Pool moves (docs/pool-moves.md): a leader asked to hand a pool over, or handed one, takes
        # the lead again (``_relead``); the next leadership carries the move out or serves the pool.
        self._relead = asyncio.Event()
        self.moves: PoolMoves | None = None
        local = config.local_shard()
        if keeps_placements(config) and local is not None:
            self.moves = PoolMoves(self.store, local.name, lambda shard: config.store_namespace(shard) or "")
        self.api.moves = self.moves
        self.api.relead = self._relead.set
        self.api.drain = self._drain
        self._draining: dict[str, asyncio.Task[None]] = {}
        self._joining: asyncio.Future[None] | None = None
        """Pools handed to this shard being added to its running engine (``_join``)."""
        self._clock = time.time_ns
        self.on_listening = on_listening
        self._core_config = core_config(config)
        self._credentials = _credentials(config)
        host, port = parse_socket_addr(config.server.grpc_addr)
        self._host = host
        self._port = port
        self._stop = asyncio.Event()
        self._grace = config.server.shutdown_grace_s
        self.service: ShardService | None = None
        self.http: HttpGateway | None = None
        # One set of in-flight limits for the unary calls of every listener (gRPC, HTTP, forwarded).
        self.unary = UnaryRunner(config.limits)
        self._scaler = _WebhookScaler(config)
        # gRPC-Web: a front owns the gRPC address and passes native gRPC on to grpcio (grpc_web.py).
        self.web_front: GrpcWebFront | None = None
        if config.server.grpc_web is not None:
            self.web_front = GrpcWebFront(config, self.api, self.router, self.authenticator, self.unary)
        # OpenTelemetry (OTEL_* environment): None, and no cost, when nothing is to be exported.
        self.telemetry = telemetry.setup(config, self.api)

    # ------------------------------------------------------------------------------- control

    def stop(self, grace: float | None = None) -> None:
        """Begin a graceful stop (idempotent); ``grace`` overrides ``shutdown_grace_s``."""
        if grace is not None:
            self._grace = min(self._grace, grace)
        self._stop.set()

    @property
    def grpc_address(self) -> str:
        return _format_addr(self._host, self._port)

    # ------------------------------------------------------------------------------- listeners

    async def _listen(self, *, standby: bool) -> grpc.aio.Server:
        server = grpc.aio.server(
            options=server_options(self.config, standby=standby), interceptors=telemetry.grpc_interceptors()
        )
        services = GrpcServices(self.api, self.authenticator, router=self.router, standby=standby, unary=self.unary)
        services.add_to(server)
        # Calls other nodes forward here, several per message on one stream per node.
        forwarding = ForwardService(
            self.router, self.authenticator, self.unary, services.principal_of, self.config.limits.max_message_bytes
        )
        forwarding.add_to(server)
        address = _format_addr(self._host, self._port)
        if self.web_front is not None:
            address = "unix:" + self.web_front.next_socket()  # the front owns the TCP address
        try:
            if self._credentials is not None:
                port = server.add_secure_port(address, self._credentials)
            else:
                port = server.add_insecure_port(address)
        except RuntimeError:
            raise BindError(f"cannot listen on {address}: {_bind_problem(self._host, self._port)}") from None
        if port == 0:
            raise BindError(f"cannot listen on {address}: {_bind_problem(self._host, self._port)}")
        # Port 0 picks a free port once; later listeners (standby <-> leader) reuse it.
        if self.web_front is None:
            self._port = port
        await server.start()
        if self.web_front is not None:
            self.web_front.target = address.removeprefix("unix:")
        role = "standby" if standby else "leader"
        self.api.address = self.grpc_address
        log.info("listening (%s) grpc=%s", role, self.grpc_address)
        if self.on_listening is not None:
            http = self.http
            http_address, metrics_address = (http.address, http.metrics_address) if http is not None else (None, None)
            self.on_listening(Listening(role, self.grpc_address, http_address, metrics_address))
        return server

    # ------------------------------------------------------------------------------- lifecycle

    async def run(self) -> None:
        """Serve until ``stop()``. Raises ``BindError`` when the listener cannot bind."""
        if self.telemetry is not None:
            self.telemetry.start()
        for warning in self.config.warnings:
            log.warning("configuration: %s", warning)
        # The HTTP gateway runs for the whole process: it asks the Api on every request whether
        # this node is the serving leader (standbys answer 503, /readyz included).
        try:
            self.http = await start_http(
                self.api, self.config, authenticator=self.authenticator, router=self.router, unary=self.unary
            )
        except ListenError as exc:
            raise BindError(str(exc)) from None
        try:
            if self.web_front is not None:
                try:
                    self._port = await self.web_front.start(self._host, self._port)
                except OSError as exc:
                    raise BindError(f"cannot listen on {self.grpc_address}: {exc.strerror or exc}") from None
            server = await self._listen(standby=True)
        except BaseException:
            if self.web_front is not None:
                await self.web_front.close()
            await self.http.close()
            raise
        try:
            while not self._stop.is_set():
                service = await self._acquire()
                if service is None:
                    break
                await _stop_server(server, 0)
                server = await self._listen(standby=False)
                ended = await self._lead(service)
                if ended == "stop":
                    await self._graceful(service, server)
                    break
                if ended == "relead":
                    # A pool move: running attempts get a short grace, then leadership is let go.
                    log.info("taking the lead again for a pool move")
                    await service.shutdown(min(self._grace, RELEAD_GRACE_S))
                else:
                    log.warning("leadership lost (%s); standing by", service.driver.stop_reason or "unknown")
                self.api.service = None
                self.service = None
                self.http.retire_connections(SHUTDOWN_LINGER_S)  # HTTP clients reconnect, as gRPC ones do
                # Calls that arrived while this node led but were not started yet (a leader woken
                # from a freeze finds many) start now and hear UNAVAILABLE, which callers retry; a
                # listener stopped at once would cancel them (CANCELLED, which they do not retry).
                await asyncio.sleep(SHUTDOWN_LINGER_S)
                await _stop_server(server, SHUTDOWN_LINGER_S)
                with contextlib.suppress(Exception):
                    await self.store.release_leadership()
                server = await self._listen(standby=True)
        finally:
            self.api.service = None
            await _stop_server(server, 0)
            if self.web_front is not None:
                await self.web_front.close()
            await self.http.close()
            await self.router.close()
            await self._scaler.close()
            if self.telemetry is not None:
                await self.telemetry.shutdown()  # flush spans and metrics
            with contextlib.suppress(Exception):
                await self.store.close()

    async def _acquire(self) -> ShardService | None:
        """A service that leads the shard, or None when stopped first."""
        delay = 0.5
        while not self._stop.is_set():
            options = ServiceOptions(
                output_cache_entries=self.config.outputs.cache_entries,
                output_cache_bytes=self.config.outputs.cache_bytes,
                max_slots_per_worker=self.config.limits.max_slots_per_worker,
                driver=DriverOptions(
                    keep_finished_s=_keep_finished_s(self.config),
                    trouble=self.api.store_trouble,
                    configure=self._configure if keeps_placements(self.config) else None,
                ),
            )
            service = telemetry.shard_service_type()(self._core_config, store=self.store, options=options)
            service.on_scale = self._scaler.scale
            log.info("waiting for leadership")
            leading = asyncio.ensure_future(service.lead())
            stopping = asyncio.ensure_future(self._stop.wait())
            try:
                await asyncio.wait({leading, stopping}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopping.cancel()
            if not leading.done():
                leading.cancel()
                with contextlib.suppress(BaseException):
                    await leading
                return None
            error = leading.exception()
            if error is None:
                return service
            if isinstance(error, SchemaTooNew | ShardMismatch):
                raise error
            log.warning("could not take leadership (%s); retrying in %.1fs", error, delay)
            with contextlib.suppress(Exception):
                await self.store.release_leadership()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay)
            delay = min(delay * 2, 10.0)
        return None

    async def _configure(self, epoch: int) -> CoreConfig:
        """Once leading, before recovery: the shard's pools from its durable placements, for the
        engine, the API and the router (docs/pool-moves.md)."""
        if self.moves is not None:
            await self.moves.carry_out(epoch)
        placed, topology = await placed_config(self.file_config, self.store)
        self.config = placed
        self.api.adopt(placed, topology)
        for pool, placement in topology.placements().items():
            self.router.topology.learn(pool, placement)
        self._core_config = core_config(placed)
        return self._core_config

    def _drain(self, move: MoveRow, start: bool) -> None:
        """Start (or stop) draining ``move``'s pool under the current leadership."""
        running = self._draining.pop(move.pool, None)
        if running is not None:
            running.cancel()
        if start and self.service is not None:
            self._draining[move.pool] = asyncio.ensure_future(self._drained(self.service, move))
        elif not start and self.service is not None:
            service = self.service
            self._draining[move.pool] = asyncio.ensure_future(service.withhold(move.pool, False))

    async def _drained(self, service: ShardService, move: MoveRow) -> None:
        """Start no attempt of the pool; once none of it runs, mark the move ``requested`` and take
        the lead again, which carries it out (docs/pool-moves.md: running attempts end here)."""
        assert self.moves is not None
        while True:
            try:
                await service.withhold(move.pool)
                while await service.running_in(move.pool) > 0:
                    await asyncio.sleep(DRAIN_POLL_S)
                if await self.moves.drained(service.driver.epoch or 0, move):
                    log.info("pool %r drained for its move to shard %r", move.pool, move.target)
                    if not self.moves.live or not await self._hand_over(service, move):
                        self._relead.set()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the store's troubles: the driver notices them too
                log.warning("draining pool %r for its move: %s; retrying", move.pool, exc)
                await asyncio.sleep(DRAIN_POLL_S * 10)

    async def _hand_over(self, service: ShardService, move: MoveRow) -> bool:
        """Carry out a drained ``move`` while leading (docs/pool-moves.md): the engine lets go of
        the pool, its rows go to the target in one fenced transaction, and this node routes the
        pool there; no other pool notices. False: it is left to the next leadership instead (the
        pool is this engine's only one, or the store failed with the pool let go of)."""
        assert self.moves is not None
        epoch = service.driver.epoch or 0
        try:
            # Fold the event log into the rows while the pool still admits: the handover folds
            # again after the engine let go of the pool, with little left to do then.
            await self.moves.fold()
        except Exception as exc:  # the store's troubles: the handover below meets them too
            log.debug("compacting before a handover: %s", exc)
        # From here until the pool is served by the target (or again here), callers retry.
        self.api.leaving = {**self.api.leaving, move.pool: move.target}
        started = time.monotonic()
        try:
            try:
                await service.release_pool(move.pool)
                released = time.monotonic()
            except ConfigError as refused:  # its only pool, or an abort let an attempt start
                log.info("pool %r is moved in a takeover: %s", move.pool, refused)
                return False
            if not await self.moves.hand_over(epoch, move):
                # Refused by a check: the pool stays, with its rows as the store holds them.
                rows = await self.moves.rows(move.pool, self._clock(), self._core_config.retention)
                await service.join_pool(self._pool_config(self.config, move.pool), rows)
                return True
            service.driver.pools_away.discard(move.pool)
            handed = time.monotonic()
            # The record now places the pool on the target at the move's version (the transaction
            # wrote it): no need to read it back.
            self._serve_record({**self.api.topology.record(), move.pool: (move.target, move.version)})
            log.info("pool %r let go of in %.3f s, handed over in %.3f s, routed there in %.3f s", move.pool,
                     released - started, handed - released, time.monotonic() - handed)  # fmt: skip
            return True
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the store's troubles: the next leadership resumes the move
            log.warning("handing pool %r over while leading failed: %s; taking the lead again", move.pool, exc)
            return False
        finally:
            self.api.leaving = {pool: to for pool, to in self.api.leaving.items() if pool != move.pool}

    def _handed(self, placed: frozenset[str], record: dict[str, tuple[str, int]]) -> bool:
        """The record now places ``placed`` on this shard (a pool handed to it, or given away):
        with live moves, pools handed here join the running engine; otherwise, or when that fails,
        the next leadership serves them. Answers whether to keep watching."""
        arriving = placed - frozenset(self.api.pools)
        leaving = frozenset(self.api.pools) - placed
        if leaving <= frozenset(self.api.leaving) and not arriving:
            return True  # this leader's own handover, which updates what it serves itself
        self.api.incoming = arriving
        service = self.service
        if self.moves is None or not self.moves.live or service is None or leaving - frozenset(self.api.leaving):
            log.info("this shard's placements changed (now %s); taking the lead again", sorted(placed))
            self._relead.set()
            return False
        if self._joining is None or self._joining.done():
            self._joining = asyncio.ensure_future(self._join(service, arriving, record))
        return True

    async def _join(self, service: ShardService, arriving: frozenset[str], record: dict[str, tuple[str, int]]) -> None:
        """Add pools handed to this shard to its running engine, with their stored rows, then
        serve them; if that fails, the next leadership serves them."""
        moves = self.moves
        assert moves is not None
        try:
            topology, _ = Topology.adopt(self.file_config, record)
            placed = topology.apply(self.file_config)
            for pool in sorted(arriving):
                read = time.monotonic()
                rows = await moves.rows(pool, self._clock(), self._core_config.retention)
                joining = time.monotonic()
                adopted = await service.join_pool(self._pool_config(placed, pool), rows)
                log.info("pool %r joined this shard's engine: %d tasks, %d schedules (its rows read in %.3f s,"
                         " joined in %.3f s)", pool, adopted.tasks, adopted.schedules, joining - read,
                         time.monotonic() - joining)  # fmt: skip
                if adopted.key_clashes:
                    log.error("pool %r: keys already held by other pools here keep naming those tasks: %s", pool,
                              adopted.key_clashes[:5])  # fmt: skip
            self._serve(placed, topology)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("adding pools %s to the running engine failed: %s; taking the lead again", sorted(arriving),
                        exc)  # fmt: skip
            self._relead.set()

    def _serve_record(self, record: dict[str, tuple[str, int]]) -> None:
        """Serve and route by ``record``, the shard's durable placements as they are now."""
        topology, _ = Topology.adopt(self.file_config, record)  # differences: logged at leadership
        self._serve(topology.apply(self.file_config), topology)

    def _serve(self, placed: Config, topology: Topology) -> None:
        """Serve and route by the shard's durable placements as ``placed_config`` read them."""
        self.config = placed
        self._core_config = core_config(placed)
        self.api.adopt(placed, topology)
        for pool, placement in topology.placements().items():
            self.router.topology.learn(pool, placement)

    @staticmethod
    def _pool_config(config: Config, pool: str) -> PoolConfig:
        """The engine's configuration of ``pool`` as ``config`` gives it to this shard."""
        for pool_config in core_config(config).pools:
            if pool_config.name == pool:
                return pool_config
        raise ConfigError(f"pool {pool!r} is not placed on this shard")

    async def _lead(self, service: ShardService) -> str:
        """Serve as the leader until stop() ("stop"), leadership is lost ("lost") or a pool move
        asks for a new leadership ("relead")."""
        self.service = service
        self.api.service = service
        log.info("leadership gained (epoch %s)", service.driver.epoch)
        self._relead.clear()
        lost = asyncio.ensure_future(service.driver.wait_stepped_down())
        stopping = asyncio.ensure_future(self._stop.wait())
        relead = asyncio.ensure_future(self._relead.wait())
        watching = None
        if self.moves is not None:
            known = frozenset(pool.name for pool in self.file_config.pools)
            watching = asyncio.ensure_future(self.moves.watch(lambda: frozenset(self.api.pools), known, self._handed))
        try:
            await asyncio.wait({lost, stopping, relead}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            # The move watcher and drains may be inside a store call: they end before the next leadership.
            draining = list(self._draining.values())
            self._draining.clear()
            joining, self._joining = self._joining, None
            await _cancel_and_wait(stopping, relead, watching, joining, *draining)
        if lost.done():
            return "lost"
        await _cancel_and_wait(lost)
        return "stop" if self._stop.is_set() else "relead"

    async def _graceful(self, service: ShardService, server: grpc.aio.Server) -> None:
        log.info("shutting down: running attempts get %.1fs", self._grace)
        await service.shutdown(self._grace)
        # Work streams send Shutdown and linger briefly; unary calls in flight finish.
        await _stop_server(server, SHUTDOWN_LINGER_S + 0.5)
        log.info("stopped")


async def _cancel_and_wait(*tasks: asyncio.Future[Any] | None) -> None:
    """Cancel ``tasks`` (None: absent) and wait until each has ended, so none outlives its owner."""
    ending = [task for task in tasks if task is not None]
    for task in ending:
        task.cancel()
    for outcome in await asyncio.gather(*ending, return_exceptions=True):
        if isinstance(outcome, Exception):
            log.warning("a background task failed: %s", outcome, exc_info=outcome)


async def _stop_server(server: grpc.aio.Server, grace: float) -> None:
    """Stop a listener; never wait much longer than ``grace`` for it."""
    try:
        await asyncio.wait_for(server.stop(grace), grace + 5.0)
    except TimeoutError:
        log.warning("the gRPC listener did not stop within %.1fs", grace + 5.0)


class _WebhookScaler:
    """POSTs ``{"pool": ..., "desired": n}`` for pools with a webhook scaler, latest value wins."""

    def __init__(self, config: Config) -> None:
        self._hooks = {pool.name: pool.scaler for pool in config.pools if isinstance(pool.scaler, WebhookScaler)}
        self._latest: dict[str, int] = {}
        self._senders: dict[str, asyncio.Task[None]] = {}
        self._session: Any = None

    def scale(self, pool: str, desired: int) -> None:
        if pool not in self._hooks or self._latest.get(pool) == desired:
            return
        self._latest[pool] = desired
        sender = self._senders.get(pool)
        if sender is None or sender.done():
            self._senders[pool] = asyncio.ensure_future(self._send(pool))

    async def _send(self, pool: str) -> None:
        import aiohttp

        hook = self._hooks[pool]
        sent: int | None = None
        while self._latest.get(pool) != sent:
            desired = self._latest[pool]
            if self._session is None:
                self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
            headers = {"authorization": f"Bearer {hook.token}"} if hook.token else {}
            try:
                async with self._session.post(hook.url, json={"pool": pool, "desired": desired}, headers=headers) as r:
                    if r.status >= 300:
                        log.warning("scale request for pool %s failed: HTTP %d", pool, r.status)
            except Exception as exc:
                log.warning("scale request for pool %s failed: %s", pool, exc)
            sent = desired

    async def close(self) -> None:
        await _cancel_and_wait(*self._senders.values())  # before their session closes
        if self._session is not None:
            await self._session.close()


def print_line(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
