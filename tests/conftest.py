"""Store fixtures: a real Postgres server for the store tests, and one schema per test.

``postgres_dsn`` (session): ``CRONOQ_TEST_DSN`` when set; otherwise a throwaway cluster made with
``initdb``/``pg_ctl`` in a temporary directory, on a free loopback port, trust authentication,
fsync off, stopped and deleted at the end of the session. As root the server runs as the
``postgres`` OS user. Without Postgres binaries the fixture fails and says what to install.

``pg_schema`` (function): a fresh schema name; the schema is dropped after the test.

Every test and the session as a whole fail when asyncio reports a task destroyed while pending
(``tests/pending_tasks.py``).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.pending_tasks import REPORTS

INSTALL_HINT = (
    "PostgreSQL server binaries (initdb, pg_ctl) were not found. Install them, e.g. "
    "`apt-get install -y postgresql` on Debian/Ubuntu (or run scripts/ensure_postgres.sh), "
    "or point CRONOQ_TEST_DSN at a database the tests may create schemas in."
)


def _pg_bindir() -> Path | None:
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=True)
            candidates.append(Path(out.stdout.strip()))
        except (OSError, subprocess.CalledProcessError):
            pass
    versions = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else 0,
        reverse=True,
    )
    candidates.extend(Path(p) for p in versions)
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(Path(initdb).resolve().parent)
    for bindir in candidates:
        if (bindir / "initdb").is_file() and (bindir / "pg_ctl").is_file():
            return bindir
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _TempCluster:
    """A private Postgres cluster in a temporary directory."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.as_postgres = os.geteuid() == 0
        self.root = Path(tempfile.mkdtemp(prefix="cronoq-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = 0
        self.dsn = ""

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if self.as_postgres:
            runuser = shutil.which("runuser")
            if runuser:
                cmd = [runuser, "-u", "postgres", "--", *cmd]
            else:
                cmd = ["su", "postgres", "-s", "/bin/sh", "-c", " ".join(_sh_quote(c) for c in cmd)]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=self.root)

    def start(self) -> str:
        if self.as_postgres:
            try:
                shutil.chown(self.root, user="postgres", group="postgres")
            except (LookupError, PermissionError) as exc:
                pytest.fail(f"running as root, but cannot hand {self.root} to the postgres user: {exc}")
        init = self._run(
            "initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C", "--no-sync"
        )
        if init.returncode != 0:
            pytest.fail(f"initdb failed:\n{init.stdout}\n{init.stderr}")
        last = ""
        for _ in range(5):
            self.port = _free_port()
            options = (
                f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=off "
                "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
            )
            started = self._run(
                "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "-o", options, "start"
            )
            if started.returncode == 0:
                return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
            last = started.stdout + started.stderr
            if self.log.exists():
                last += self.log.read_text(errors="replace")[-2000:]
        pytest.fail(f"could not start a throwaway Postgres server:\n{last}")

    def pause(self) -> None:
        """Stop the server but keep its data: an outage the tests can end with ``resume``."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def resume(self) -> None:
        options = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        started = self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "-o", options, "start"
        )
        if started.returncode != 0:
            pytest.fail(f"could not restart the throwaway Postgres server:\n{started.stdout}{started.stderr}")

    def stop(self) -> None:
        try:
            if self.data.exists():
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def _sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """A DSN of a Postgres database the tests may create and drop schemas in."""
    dsn = os.environ.get("CRONOQ_TEST_DSN")
    if dsn:
        yield dsn
        return
    bindir = _pg_bindir()
    if bindir is None:
        pytest.fail(INSTALL_HINT)
    cluster = _TempCluster(bindir)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


@pytest.fixture
def private_postgres() -> Iterator[_TempCluster]:
    """A Postgres cluster of this test's own, which the test may stop and restart (outage drills)."""
    bindir = _pg_bindir()
    if bindir is None:
        pytest.fail(INSTALL_HINT)
    cluster = _TempCluster(bindir)
    try:
        cluster.dsn = cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
async def pg_schema(postgres_dsn: str) -> AsyncIterator[str]:
    """A schema name no other test uses; the schema is dropped afterwards."""
    import asyncpg

    name = f"cronoq_t_{uuid.uuid4().hex[:16]}"
    yield name
    conn = await asyncpg.connect(postgres_dsn)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    finally:
        await conn.close()


@pytest.fixture(autouse=True)
def no_task_left_pending() -> Iterator[None]:
    yield
    REPORTS.check_test()


def pytest_sessionfinish(session: pytest.Session) -> None:
    REPORTS.check_session(session)
