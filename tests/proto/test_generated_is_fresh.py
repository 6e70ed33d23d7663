"""The committed generated modules match what scripts/gen_proto.py produces from the .proto file."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load_generator() -> ModuleType:
    path = ROOT / "scripts" / "gen_proto.py"
    spec = importlib.util.spec_from_file_location("cronoq_gen_proto", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


def test_generated_code_is_fresh() -> None:
    try:
        import grpc_tools  # noqa: F401
    except ImportError:
        pytest.fail("grpcio-tools is missing; it is part of the test extra: pip install -e '.[test]'")
    gen = _load_generator()
    fresh = gen.generate()
    assert set(fresh) == {"cronoq_pb2.py", "cronoq_pb2.pyi", "cronoq_pb2_grpc.py"}
    stale = []
    for name, text in fresh.items():
        committed = ROOT / "cronoq" / "proto" / name
        if not committed.is_file() or committed.read_text(encoding="utf-8") != text:
            stale.append(name)
    assert not stale, f"stale generated files {stale}: run `python scripts/gen_proto.py`"


def test_grpc_module_imports_its_sibling() -> None:
    text = (ROOT / "cronoq" / "proto" / "cronoq_pb2_grpc.py").read_text(encoding="utf-8")
    assert "from . import cronoq_pb2 as" in text
    assert "from cronoq.v1 import" not in text


def test_proto_text_is_the_source_file() -> None:
    import cronoq.proto

    source = (ROOT / "cronoq" / "proto" / "cronoq" / "v1" / "cronoq.proto").read_text(encoding="utf-8")
    text = cronoq.proto.PROTO_TEXT
    assert text == source
    assert "package cronoq.v1;" in text
    assert cronoq.proto.PROTO_FILE == "cronoq/v1/cronoq.proto"


def test_proto_package_is_a_leaf() -> None:
    """Importing the generated modules pulls in nothing else from cronoq."""
    import subprocess

    code = (
        "import sys\n"
        "from cronoq.proto import cronoq_pb2, cronoq_pb2_grpc\n"
        "extra = sorted(m for m in sys.modules if m.startswith('cronoq') and m != 'cronoq'"
        " and not m.startswith('cronoq.proto'))\n"
        "print(','.join(extra))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == ""
