"""Opaque payloads and outputs of server tasks: bytes plus a content type, and their codec."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

_MARK = b"\x01"  # distinguishes a blob from plain JSON text in the store


@dataclass(frozen=True, slots=True)
class Blob:
    data: bytes
    content_type: str = ""

    def __len__(self) -> int:
        return len(self.data)


class BlobCodec:
    """Stores a Blob as: 0x01, content-type length (u16), content type (UTF-8), data.

    Anything else (values a template or an older row holds) is stored as JSON, like the default
    codec, so the store stays readable with either.
    """

    __slots__ = ()

    def encode(self, obj: Any, /) -> bytes:
        if isinstance(obj, Blob):
            ctype = obj.content_type.encode("utf-8")
            return _MARK + struct.pack(">H", len(ctype)) + ctype + obj.data
        if obj is None:
            return b""
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")

    def decode(self, data: bytes, /) -> Any:
        if not data:
            return None
        if data[:1] == _MARK:
            (length,) = struct.unpack(">H", data[1:3])
            ctype = data[3 : 3 + length].decode("utf-8")
            return Blob(bytes(data[3 + length :]), ctype)
        return json.loads(data)
