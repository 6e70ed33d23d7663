"""The container image (Dockerfile): built from this checkout, then run as operators run it.

Containers use the host's network namespace and bind loopback addresses only; the Docker daemon
started by scripts/ensure_docker.sh has no bridge network at all.
"""

from __future__ import annotations

import io
import json
import re
import secrets
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import DEPLOY, ROOT, free_port, run

ROLES = ("client", "worker", "metrics", "admin")


def docker(*args: str, check: bool = True, timeout: float = 120.0) -> str:
    return run(["docker", *args], check=check, timeout=timeout).stdout.strip()


def test_check_validates_the_baked_in_configuration_on_a_read_only_root(image: str) -> None:
    done = run(["docker", "run", "--rm", "--read-only", "--network", "none", image, "--check"])
    assert "configuration is valid" in done.stdout


def test_check_names_the_problems_of_a_mounted_configuration(image: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[server]\ngrpc_addr = "0.0.0.0:7070"\nshutdown_grace_s = -1\n\n[[pools]]\nname = "x y"\n')
    done = run(
        [
            "docker",
            "run",
            "--rm",
            "--read-only",
            "--network",
            "none",
            "-v",
            f"{bad}:/c.toml:ro",
            image,
            "--config",
            "/c.toml",
            "--check",
        ],
        check=False,
    )
    assert done.returncode == 1
    assert "shutdown_grace_s" in done.stdout and "pools[0].name" in done.stdout, done.stdout


def test_the_image_runs_as_a_non_root_user_with_the_example_configuration(image: str) -> None:
    config = json.loads(docker("image", "inspect", image))[0]["Config"]
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["cronoq-server"]
    assert "CRONOQ_CONFIG=/etc/cronoq/cronoq.toml" in config["Env"]
    baked = run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "cat", image, "/etc/cronoq/cronoq.toml"])
    assert baked.stdout == (DEPLOY / "cronoq.example.toml").read_text()


def test_the_runtime_image_carries_no_build_tools(image: str) -> None:
    container = docker("create", image)
    try:
        raw = subprocess.run(["docker", "export", container], capture_output=True, check=True, timeout=300).stdout
    finally:
        docker("rm", container)
    with tarfile.open(fileobj=io.BytesIO(raw)) as archive:
        names = {name.lstrip("./") for name in archive.getnames()}
    for command in ("cronoq-server", "cronoq", "cronoq-operator"):
        assert f"opt/cronoq/bin/{command}" in names, command
    for tool in (
        "usr/bin/gcc",
        "usr/bin/cc",
        "usr/bin/make",
        "usr/bin/ld",
        "opt/cronoq/bin/pip",
        "usr/local/bin/pip",
        "usr/bin/pip3",
    ):
        assert tool not in names, tool
    installers = [name for name in names if "/site-packages/pip/" in name or "/site-packages/setuptools/" in name]
    assert not installers, installers[:5]


class Containers:
    """Containers started by one test, removed at its end whatever happens."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def start(self, *args: str) -> str:
        name = f"cronoq-test-{secrets.token_hex(4)}"
        docker("run", "-d", "--name", name, *args)
        self.names.append(name)
        return name

    def logs(self, name: str) -> str:
        return run(["docker", "logs", name], check=False).stderr[-3000:]

    def remove(self) -> None:
        for name in self.names:
            run(["docker", "rm", "-f", name], check=False)


@pytest.fixture
def containers() -> Iterator[Containers]:
    started = Containers()
    try:
        yield started
    finally:
        started.remove()


def _http(
    url: str, body: dict[str, object] | None = None, token: str | None = None, timeout: float = 30.0
) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    if data:
        request.add_header("content-type", "application/json")
    if token:
        request.add_header("authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
    except OSError:
        return 0, b""


def _wait_ready(url: str, containers: Containers, server: str, limit: float = 90.0) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if _http(f"{url}/readyz", timeout=2)[0] == 200:
            return
        state = docker("inspect", "-f", "{{.State.Running}}", server)
        assert state == "true", f"the server container stopped:\n{containers.logs(server)}"
        time.sleep(0.2)
    raise AssertionError(f"the server did not become ready:\n{containers.logs(server)}")


def _uid_of(container: str) -> int:
    pid = docker("inspect", "-f", "{{.State.Pid}}", container)
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError("no Uid line")


def test_server_and_worker_containers_run_a_task_submitted_over_http(
    image: str, tmp_path: Path, containers: Containers
) -> None:
    tokens = {role: secrets.token_hex(20) for role in ROLES}
    env = [arg for role, token in tokens.items() for arg in ("-e", f"CRONOQ_{role.upper()}_TOKEN={token}")]
    grpc_port, http_port = free_port(), free_port()
    config = (DEPLOY / "cronoq.example.toml").read_text()
    # The example listens on every interface; here the containers share the host's network, so
    # the listeners stay on loopback ports of their own.
    for key, port in (("grpc_addr", grpc_port), ("http_addr", http_port)):
        config, count = re.subn(rf'^{key} = "0\.0\.0\.0:\d+"', f'{key} = "127.0.0.1:{port}"', config, flags=re.M)
        assert count == 1, f"the example no longer sets {key} to 0.0.0.0"
    path = tmp_path / "cronoq.toml"
    path.write_text(config)
    path.chmod(0o644)

    # The mounted file replaces the baked-in one at the path CRONOQ_CONFIG names.
    server = containers.start(
        "--network", "host", "--read-only", *env, "-v", f"{path}:/etc/cronoq/cronoq.toml:ro", image
    )
    url = f"http://127.0.0.1:{http_port}"
    _wait_ready(url, containers, server)

    worker_script = ROOT / "tests" / "deploy" / "container_worker.py"
    worker = containers.start(
        "--network",
        "host",
        "--read-only",
        "-e",
        f"CRONOQ_WORKER_TOKEN={tokens['worker']}",
        "-v",
        f"{worker_script}:/opt/test/worker.py:ro",
        "--entrypoint",
        "python3",
        image,
        "/opt/test/worker.py",
        f"127.0.0.1:{grpc_port}",
        "default",
    )

    status, body = _http(
        f"{url}/v1/tasks", {"payload": {"n": 7}, "wait": True, "wait_timeout_s": 60}, token=tokens["client"], timeout=90
    )
    assert status == 200, body
    result = json.loads(body)["result"]
    assert result["status"] == "succeeded", result
    output = result["output"]
    assert output["echo"] == {"n": 7}
    assert output["uid"] == 10001  # the worker container's user
    assert docker("inspect", "-f", "{{.Config.Hostname}}", worker) == output["host"]

    # The CLI in the image, from a third container, over gRPC.
    cli = run(
        [
            "docker",
            "run",
            "--rm",
            "--network",
            "host",
            "--read-only",
            "-e",
            f"CRONOQ_TOKEN={tokens['client']}",
            "--entrypoint",
            "cronoq",
            image,
            "--addr",
            f"http://127.0.0.1:{grpc_port}",
            "submit",
            '{"n": 8}',
            "--json",
            "--wait",
        ]
    )
    assert json.loads(cli.stdout)["echo"] == {"n": 8}

    # The server process runs as the image's user, on a root filesystem it cannot write.
    assert _uid_of(server) == 10001
    assert docker("inspect", "-f", "{{.HostConfig.ReadonlyRootfs}}", server) == "true"
    write = run(["docker", "exec", server, "python3", "-c", "open('/etc/cronoq/x', 'w')"], check=False)
    assert write.returncode != 0 and "Read-only file system" in write.stderr, write.stderr
    metrics = _http(f"{url}/metrics", token=tokens["metrics"])
    assert metrics[0] == 200 and b'cronoq_tasks_total{status="succeeded"} 2.0' in metrics[1]

    # SIGTERM stops it gracefully (exit status 0).
    docker("stop", "--time", "30", server, timeout=60)
    assert docker("inspect", "-f", "{{.State.ExitCode}}", server) == "0", containers.logs(server)
