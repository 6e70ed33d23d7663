"""Regenerate the committed gRPC/protobuf modules in ``cronoq/proto/`` from the ``.proto`` file.

Usage::

    python scripts/gen_proto.py          # rewrite cronoq/proto/cronoq_pb2*.py(i)
    python scripts/gen_proto.py --check  # exit 1 if the committed files are stale

protoc runs with ``cronoq/proto`` as its include root, so the file is registered in the descriptor
pool as ``cronoq/v1/cronoq.proto`` and the message module under the name ``cronoq.v1.cronoq_pb2``,
the same as the published package. protoc writes the outputs to ``cronoq/v1/`` under a scratch
directory; this script copies them flat into ``cronoq/proto/`` and points the service module's
absolute ``from cronoq.v1 import cronoq_pb2`` at the sibling module instead.

Needs ``grpcio-tools`` (in the ``test`` extra, pinned so the output is reproducible).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "cronoq" / "proto"
PROTO_FILE = "cronoq/v1/cronoq.proto"
OUTPUTS = ("cronoq_pb2.py", "cronoq_pb2.pyi", "cronoq_pb2_grpc.py")

_ABSOLUTE_IMPORT = "from cronoq.v1 import cronoq_pb2 as cronoq_dot_v1_dot_cronoq__pb2"
_RELATIVE_IMPORT = "from . import cronoq_pb2 as cronoq_dot_v1_dot_cronoq__pb2"


def _fix_up(name: str, text: str) -> str:
    if name == "cronoq_pb2_grpc.py":
        if _ABSOLUTE_IMPORT not in text:
            raise RuntimeError(f"{name}: the expected import line was not found; update scripts/gen_proto.py")
        text = text.replace(_ABSOLUTE_IMPORT, _RELATIVE_IMPORT)
    return text


def generate(proto_root: Path = PROTO_ROOT) -> dict[str, str]:
    """Run protoc on ``proto_root/cronoq/v1/cronoq.proto``; return ``{file name: contents}``."""
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory(prefix="cronoq-proto-") as scratch:
        args = [
            "grpc_tools.protoc",
            f"--proto_path={proto_root}",
            f"--python_out={scratch}",
            f"--pyi_out={scratch}",
            f"--grpc_python_out={scratch}",
            PROTO_FILE,
        ]
        status = protoc.main(args)
        if status != 0:
            raise RuntimeError(f"protoc failed with status {status}")
        produced = Path(scratch) / "cronoq" / "v1"
        return {name: _fix_up(name, (produced / name).read_text(encoding="utf-8")) for name in OUTPUTS}


def stale_files(out_dir: Path = PROTO_ROOT) -> list[str]:
    """Names of generated files in ``out_dir`` that differ from a fresh generation (or are missing)."""
    fresh = generate()
    stale = []
    for name, text in fresh.items():
        path = out_dir / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            stale.append(name)
    return stale


def write(out_dir: Path = PROTO_ROOT) -> list[Path]:
    written = []
    for name, text in generate().items():
        path = out_dir / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report whether the committed files are stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files()
        for name in stale:
            print(f"stale: cronoq/proto/{name}", file=sys.stderr)
        if stale:
            print("run: python scripts/gen_proto.py", file=sys.stderr)
        return 1 if stale else 0
    for path in write():
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
