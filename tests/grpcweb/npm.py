"""The npm side of the tests: Connect-ES (a real gRPC-Web client) with code generated from our
.proto files, installed with ``npm ci`` into a cache folder outside the source tree.

``node_project()`` copies ``package.json`` and ``package-lock.json`` of this folder into
``build/npm/<hash of the lock>/``, runs ``npm ci`` there once (later runs reuse it), generates the
Connect-ES modules of ``cronoq/v1/cronoq.proto`` and ``cronoq/console/v1/console.proto`` with
protoc (from grpcio-tools) and the ``protoc-gen-es`` plugin the lock pins, and copies the client
scripts beside them, so that Node.js resolves their imports from that folder. Without ``node`` or
``npm`` it fails and says what to install; it never skips.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CACHE = ROOT / "build" / "npm"
PROTOS = ("cronoq/v1/cronoq.proto", "cronoq/console/v1/console.proto")
ES_OPTIONS = "target=js,import_extension=js"


def _need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.fail(
            f"{tool} is needed for the gRPC-Web client tests: install Node.js 20 or newer with npm "
            f"(e.g. `apt-get install -y nodejs npm`)"
        )
    return path


def node_project() -> Path:
    """The installed project folder (idempotent; safe to call from every test)."""
    npm = _need("npm")
    _need("node")
    lock = (HERE / "package-lock.json").read_bytes()
    sources = [
        lock,
        (HERE / "package.json").read_bytes(),
        *((ROOT / "cronoq" / "proto" / p).read_bytes() for p in PROTOS),
    ]
    digest = hashlib.sha256(b"\0".join([*sources, ES_OPTIONS.encode()])).hexdigest()[:16]
    project = CACHE / digest
    if not (project / ".installed").is_file():
        project.mkdir(parents=True, exist_ok=True)
        for name in ("package.json", "package-lock.json"):
            shutil.copy(HERE / name, project / name)
        done = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--cache", str(CACHE / "cache")],
            cwd=project,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode != 0:
            pytest.fail(f"npm ci failed in {project}:\n{done.stdout}\n{done.stderr}")
        generated = project / "gen"
        generated.mkdir(exist_ok=True)
        plugin = project / "node_modules" / ".bin" / "protoc-gen-es"
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"--plugin=protoc-gen-es={plugin}",
                f"--es_out={generated}",
                f"--es_opt={ES_OPTIONS}",
                f"--proto_path={ROOT / 'cronoq' / 'proto'}",
                *PROTOS,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            pytest.fail(f"generating the Connect-ES code failed:\n{done.stderr}")
        (project / ".installed").write_text(digest)
    for script in HERE.glob("*.mjs"):
        shutil.copy(script, project / script.name)
    return project
