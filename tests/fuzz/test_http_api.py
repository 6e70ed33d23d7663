"""Schemathesis against ``/v1/openapi.json`` of a real ``cronoq-server`` process, with a worker
serving the default pool, so tasks run, finish, get cancelled and are waited for.

Every check of schemathesis runs (configuration in ``schemathesis.toml`` beside this file): each
answer documented (status, media type, headers, body), no 5xx but the documented 504 of a wait
that runs out, schema-valid requests accepted, schema-violating ones refused, credentials
required where declared, other methods answered 405; and the stateful phase follows the links
between operations (submit, then read, wait for, cancel the task). One check is left out, with
the reason in the configuration: DELETE cancels a task, it does not delete it.

A short run in ``make test``; ``make fuzz`` (``CRONOQ_FUZZ=long``) runs many more examples.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fuzz.budget import examples
from tests.server.harness import ADMIN_TOKEN, ROOT, WORKER_TOKEN
from tests.server.http_support import HttpServerProcess, process_config

HERE = Path(__file__).resolve().parent
MAX_DEPS = 4

CONFIG = process_config(
    f"""
max_wait_s = 1
max_tasks_per_batch = 8
max_deps = {MAX_DEPS}
max_tags = 4
max_resources = 2
max_key_len = 64
max_tag_len = 64
max_http_body_bytes = 65536
""",
    extra="""
[[resources]]
kind = "semaphore"
name = "gpu"
permits = 2
""",
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServerProcess]:
    directory = tmp_path_factory.mktemp("fuzz-http")
    proc = HttpServerProcess(directory, CONFIG, name="fuzz-http").start()
    worker = subprocess.Popen([sys.executable, str(HERE / "echo_worker.py"), proc.address, "default", WORKER_TOKEN],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert worker.stdout is not None
        assert worker.stdout.readline().strip() == "registered"
        yield proc
    finally:
        worker.kill()
        worker.wait(10)
        proc.stop()


def test_the_gateway_keeps_to_its_openapi_document(server: HttpServerProcess, tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.fuzz.schemathesis_hooks", "CRONOQ_FUZZ_MAX_DEPS": str(MAX_DEPS),
           "PYTHONPATH": str(ROOT)}  # fmt: skip
    command = [
        sys.executable, "-m", "schemathesis.cli", "--config-file", str(HERE / "schemathesis.toml"), "--no-color",
        "run", f"{server.http_url}/v1/openapi.json", "--header", f"Authorization: Bearer {ADMIN_TOKEN}",
        "--checks", "all", "--exclude-checks", "use_after_free", "--max-examples", str(examples(5)),
        # One worker: Hypothesis describes strategies with ast.parse, which CPython 3.11 cannot run
        # from two threads at once ("AST constructor recursion depth mismatch").
        "--workers", "1", "--wait-for-schema", "30", "--report", "json", "--report-json-path", str(report),
    ]  # fmt: skip
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    summary = _summary(report)
    print(json.dumps({"fuzz": "http_openapi", **summary}))
    assert run.returncode == 0, run.stdout[-12000:] + run.stderr[-3000:]
    assert summary["test_cases"] > 0


def _summary(report: Path) -> dict[str, int]:
    """Test cases generated and failures found, from schemathesis' JSON report."""
    try:
        cases = json.loads(report.read_text())["test_cases"]
    except (OSError, ValueError, KeyError):
        return {"test_cases": 0, "failures": -1}
    return {"test_cases": int(cases["generated"]), "failures": int(cases["unique_failures"])}
