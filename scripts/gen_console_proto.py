"""Regenerate ``cronoq/proto/console_pb2*.py(i)`` from ``cronoq/console/v1/console.proto``.

Usage::

    python scripts/gen_console_proto.py          # rewrite the generated modules
    python scripts/gen_console_proto.py --check  # exit 1 if the committed files are stale

The console's calls live in their own package (``cronoq.console.v1``), beside the published
``cronoq.v1`` contract that ``scripts/gen_proto.py`` generates; they import its messages. As there,
protoc runs with ``cronoq/proto`` as its include root and the outputs are copied flat into
``cronoq/proto/``, their absolute imports pointed at the sibling modules. Needs ``grpcio-tools``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "cronoq" / "proto"
PROTO_FILE = "cronoq/console/v1/console.proto"
OUTPUTS = ("console_pb2.py", "console_pb2.pyi", "console_pb2_grpc.py")

_FIXES = (
    ("from cronoq.v1 import cronoq_pb2 as", "from . import cronoq_pb2 as"),
    ("from cronoq.console.v1 import console_pb2 as", "from . import console_pb2 as"),
)


def generate(proto_root: Path = PROTO_ROOT) -> dict[str, str]:
    """Run protoc on the console proto; return ``{file name: contents}``."""
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
        if protoc.main(args) != 0:
            raise RuntimeError("protoc failed")
        produced = Path(scratch) / "cronoq" / "console" / "v1"
        out = {}
        for name in OUTPUTS:
            text = (produced / name).read_text(encoding="utf-8")
            for absolute, relative in _FIXES:
                text = text.replace(absolute, relative)
            out[name] = text
        return out


def _committed(name: str) -> str | None:
    path = PROTO_ROOT / name
    return path.read_text(encoding="utf-8") if path.is_file() else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report whether the committed files are stale")
    args = parser.parse_args(argv)
    fresh = generate()
    stale = [name for name, text in fresh.items() if _committed(name) != text]
    if args.check:
        for name in stale:
            print(f"stale: cronoq/proto/{name} (run: python scripts/gen_console_proto.py)", file=sys.stderr)
        return 1 if stale else 0
    for name, text in fresh.items():
        (PROTO_ROOT / name).write_text(text, encoding="utf-8")
        print(f"wrote cronoq/proto/{name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
