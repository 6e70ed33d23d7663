"""Codecs turn payloads and results into bytes for a durable store (JSON by default)."""

from cronoq.stores.base import Codec, JsonCodec

__all__ = ["Codec", "JsonCodec"]
