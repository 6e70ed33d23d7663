"""``cronoq-server``: run one shard of the scheduler behind gRPC, or check a configuration.

    cronoq-server [--config PATH] [--shard NAME] [--grpc-addr IP:PORT] [--http-addr IP:PORT]
                  [--metrics-addr IP:PORT] [--insecure-no-auth]
    cronoq-server [--config PATH] [...] --check
    cronoq-server --print-proto

The configuration path also comes from ``CRONOQ_CONFIG`` and the shard from ``CRONOQ_SHARD``.
The address flags replace ``[server]`` grpc_addr / http_addr / metrics_addr, so replicas of one
shard can share one file; they are validated like the file's values.
Without a configuration the server runs one ``default`` pool in memory on loopback listeners
with authentication off. The log level comes from ``CRONOQ_LOG`` (default ``info``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence

from cronoq.config import Config, ConfigError
from cronoq.grpc_transport import prefer_poller_endpoints

__all__ = ["main"]

log = logging.getLogger("cronoq.server")


_ADDRESS_FLAGS = {
    "grpc_addr": "gRPC listener address",
    "http_addr": "HTTP/JSON gateway address",
    "metrics_addr": "extra /metrics, /healthz, /readyz listener address",
}
"""``[server]`` keys that have a command-line flag of the same name (``--grpc-addr`` ...)."""


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cronoq-server",
        description="Elastic, priority-aware task scheduler server (gRPC API, remote workers).",
    )
    parser.add_argument(
        "-c",
        "--config",
        metavar="PATH",
        default=os.environ.get("CRONOQ_CONFIG") or None,
        help="TOML configuration file (default: $CRONOQ_CONFIG; none: built-in defaults)",
    )
    parser.add_argument("--check", action="store_true", help="validate the configuration and exit")
    parser.add_argument("--print-proto", action="store_true", help="print the cronoq.v1 .proto API and exit")
    parser.add_argument(
        "--shard",
        metavar="NAME",
        default=os.environ.get("CRONOQ_SHARD") or None,
        help="this server's entry in [[shards]] (default: $CRONOQ_SHARD or server.shard)",
    )
    for key, what in _ADDRESS_FLAGS.items():
        parser.add_argument(
            _flag(key), metavar="IP:PORT", dest=key, help=f"{what} (overrides server.{key} of the configuration)"
        )
    parser.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="allow non-loopback listeners without any credentials configured",
    )
    return parser


def _listen_overrides(args: argparse.Namespace) -> dict[str, str]:
    return {key: getattr(args, key) for key in _ADDRESS_FLAGS if getattr(args, key) is not None}


def _load(args: argparse.Namespace, *, resolve_env: bool) -> Config:
    overrides = _listen_overrides(args)
    options = {
        "shard_override": args.shard,
        "insecure_no_auth": args.insecure_no_auth,
        "resolve_env": resolve_env,
        "listen_overrides": overrides,
    }
    try:
        if args.config:
            return Config.load(args.config, **options)
        return Config.parse("", **options)
    except ConfigError as err:
        raise ConfigError(_name_flags(err.errors, overrides)) from None


def _name_flags(problems: list[str], overrides: dict[str, str]) -> list[str]:
    """Say which problems are about an address given on the command line, not in the file (a
    type error in the file's own value, which the flag replaced, keeps its plain key path)."""
    named = []
    for problem in problems:
        for key, value in overrides.items():
            prefix = f"server.{key}:"
            if problem.startswith(prefix) and value in problem:
                problem = f"{_flag(key)} (server.{key}):{problem[len(prefix) :]}"
                break
        named.append(problem)
    return named


def _check(args: argparse.Namespace) -> int:
    try:
        config = _load(args, resolve_env=False)
    except ConfigError as err:
        print(f"configuration is invalid ({len(err.errors)} problem{'s' if len(err.errors) != 1 else ''}):")
        for problem in err.errors:
            print(f"  {problem}")
        return 1
    for warning in config.warnings:
        print(f"warning: {warning}")
    print("configuration is valid")
    return 0


def _setup_diagnostics() -> None:
    """SIGUSR1 dumps every thread's Python stack to stderr (for a server that seems stuck)."""
    import faulthandler

    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, all_threads=True)


def _setup_logging() -> None:
    level = os.environ.get("CRONOQ_LOG", "info").strip().upper() or "INFO"
    logging.basicConfig(
        level=getattr(logging, level, logging.INFO),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


async def _serve(config: Config) -> int:
    from .app import BindError, Listening, ServerApp, print_line

    def announce(listening: Listening) -> None:
        word = "listening" if listening.role == "leader" else "standby"
        # The bound addresses (ports chosen by the OS for port 0), for scripts and tests.
        addresses = {"grpc": listening.grpc, "http": listening.http, "metrics": listening.metrics}
        bound = " ".join(f"{name}={address}" for name, address in addresses.items() if address)
        print_line(f"cronoq-server {word} {bound}")

    try:
        app = ServerApp(config, on_listening=announce)
    except (OSError, ValueError) as exc:
        log.error("cannot start: %s", exc)
        return 1
    loop = asyncio.get_running_loop()
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        # A second signal cuts the grace period short.
        app.stop(grace=0.0 if signals > 1 else None)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    try:
        await app.run()
    except BindError as exc:
        log.error("%s", exc)
        print(f"cronoq-server: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    return 0


def _run(config: Config) -> int:
    if os.environ.get("CRONOQ_NO_UVLOOP") != "1":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.run(_serve(config))
    return asyncio.run(_serve(config))


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.print_proto:
        from cronoq.proto import PROTO_TEXT

        sys.stdout.write(PROTO_TEXT)
        return 0
    if args.check:
        return _check(args)
    _setup_logging()
    _setup_diagnostics()
    prefer_poller_endpoints()  # before the first gRPC server or channel: see cronoq.grpc_transport
    try:
        config = _load(args, resolve_env=True)
        problems = config.file_errors()
        if problems:
            raise ConfigError(problems)
    except ConfigError as err:
        print(f"cronoq-server: {err}", file=sys.stderr)
        return 1
    return _run(config)


if __name__ == "__main__":
    sys.exit(main())
