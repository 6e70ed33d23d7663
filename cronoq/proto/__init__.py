"""The cronoq.v1 wire protocol: the ``.proto`` source and the modules generated from it.

``cronoq_pb2`` holds the messages and enums, ``cronoq_pb2_grpc`` the service stubs and servicer
bases; import them as ``from cronoq.proto import cronoq_pb2, cronoq_pb2_grpc``. Both are generated
by ``scripts/gen_proto.py`` from ``cronoq/v1/cronoq.proto`` in this directory and committed; do
not edit them by hand. This package is a leaf: it needs only protobuf and grpcio.
"""

from __future__ import annotations

from importlib import resources

__all__ = ["PROTO_FILE", "PROTO_TEXT"]

#: Name under which the file is registered in the protobuf descriptor pool.
PROTO_FILE = "cronoq/v1/cronoq.proto"

#: The ``.proto`` source text (what ``cronoq-server --print-proto`` prints).
PROTO_TEXT: str = resources.files(__name__).joinpath(PROTO_FILE).read_text(encoding="utf-8")
