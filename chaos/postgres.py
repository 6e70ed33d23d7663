"""A throwaway Postgres server of the drill's own, which the drill may stop and start again.

``initdb`` in a temporary folder, ``pg_ctl`` on a free loopback port, trust authentication for the
local connections only; run as the ``postgres`` OS user when the drill runs as root. The machine's
shared Postgres is never touched.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from cronoq.cluster.layout import HOST
from cronoq.cluster.replica import free_port

__all__ = ["PostgresError", "ThrowawayPostgres", "find_bindir"]


class PostgresError(RuntimeError):
    """The throwaway server could not be made, started or stopped; the message says why."""


def find_bindir() -> Path | None:
    """The folder with ``initdb`` and ``pg_ctl``: from ``pg_config``, the Debian layout, or PATH."""
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=True, timeout=30)
            candidates.append(Path(out.stdout.strip()))
        except (OSError, subprocess.SubprocessError):
            pass

    def version(path: str) -> int:
        name = Path(path).parent.name
        return int(name) if name.isdigit() else 0

    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True)]
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(Path(initdb).resolve().parent)
    for bindir in candidates:
        if (bindir / "initdb").is_file() and (bindir / "pg_ctl").is_file():
            return bindir
    return None


class ThrowawayPostgres:
    """``start()`` once; then ``stop(mode)`` / ``restart()`` as the drill wants; ``destroy()`` at the end."""

    def __init__(self, bindir: Path | None = None, *, host: str = HOST, prefix: Sequence[str] = ()) -> None:
        found = bindir or find_bindir()
        if found is None:
            raise PostgresError(
                "PostgreSQL server binaries (initdb, pg_ctl) were not found; install them "
                "(e.g. `apt-get install postgresql`) or run the drills with --store sqlite"
            )
        self.bindir = found
        self.host = host
        """The address it listens on: loopback, or its own in a network namespace (``prefix``
        starts its programs there, e.g. ``ip netns exec NAME``)."""
        self.prefix = list(prefix)
        self.as_postgres = os.geteuid() == 0
        self.root = Path(tempfile.mkdtemp(prefix="cronoq-chaos-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = 0

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@{self.host}:{self.port}/postgres"

    def _run(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        command = [str(self.bindir / args[0]), *args[1:]]
        if self.as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        command = [*self.prefix, *command]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=self.root)

    def _options(self) -> str:
        # A commit must be in the WAL before Postgres answers it (synchronous_commit on, the
        # default): an immediate stop throws away WAL buffers, and with it off the drill measured
        # acknowledged tasks lost by Postgres, not by cronoq. fsync and full-page writes stay off:
        # the drills crash processes, never the machine, so the kernel's page cache survives.
        return (
            f"-c listen_addresses={self.host} -p {self.port} -k {self.root} -c fsync=off "
            "-c synchronous_commit=on -c full_page_writes=off -c max_connections=300"
        )

    def start(self) -> str:
        if self.as_postgres:
            shutil.chown(self.root, user="postgres", group="postgres")
        made = self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8",
                         "--locale=C", "--no-sync")  # fmt: skip
        if made.returncode != 0:
            raise PostgresError(f"initdb failed:\n{made.stdout}{made.stderr}")
        if self.host != HOST:
            # The servers connect from their own namespaces, on the subnet this one is on.
            with open(self.data / "pg_hba.conf", "a") as hba:
                hba.write("host all all samenet trust\n")
        last = ""
        for _ in range(5):
            self.port = free_port()
            if self._pg_ctl_start():
                return self.dsn
            last = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
        raise PostgresError(f"could not start the throwaway Postgres server:\n{last}")

    def _pg_ctl_start(self) -> bool:
        started = self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "-o",
                            self._options(), "start")  # fmt: skip
        return started.returncode == 0

    def stop(self, mode: str = "immediate") -> None:
        """``pg_ctl stop -m MODE``: ``immediate`` is a crash (no checkpoint, connections cut)."""
        stopped = self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")
        if stopped.returncode != 0:
            raise PostgresError(f"pg_ctl stop failed:\n{stopped.stdout}{stopped.stderr}")

    def restart(self) -> None:
        """Start again on the same port (the servers' URL stays valid)."""
        if not self._pg_ctl_start():
            raise PostgresError("the throwaway Postgres server did not start again; log " + str(self.log))

    def destroy(self) -> None:
        try:
            if self.data.exists():
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop", timeout=60)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
