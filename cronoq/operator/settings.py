"""The operator's own configuration: the cronoq servers scalers may name, and their tokens.

A TOML file (the operator chart writes it from its values)::

    [[servers]]
    name = "main"                                   # what a scaler's spec.server names
    url = "http://cronoq.cronoq:7070"               # gRPC endpoint; https:// for TLS
    token_file = "/var/run/cronoq-operator/tokens/main"   # a token with the metrics role
    # token_env = "CRONOQ_MAIN_TOKEN"               # or from the environment
    # ca_file = "/var/run/cronoq-operator/ca/main/ca.crt" # CA of an https:// server

A token is read from its file (or variable) each time it is used, so a rotated Secret reaches
the operator without a restart; it is never logged.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["OperatorSettings", "ServerSettings", "SettingsError", "load"]

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_KEYS = {"name", "url", "token_file", "token_env", "ca_file"}


class SettingsError(ValueError):
    """The operator's configuration cannot be used; the message names the key."""


@dataclass(frozen=True)
class ServerSettings:
    name: str
    url: str
    token_file: Path | None = None
    token_env: str | None = None
    ca_file: Path | None = None

    @property
    def secure(self) -> bool:
        return self.url.startswith("https://")

    def token(self) -> str:
        """The metrics token, read now (a rotated Secret is picked up without a restart)."""
        if self.token_file is not None:
            return self.token_file.read_text().strip()
        assert self.token_env is not None
        return os.environ.get(self.token_env, "").strip()

    def ca(self) -> bytes | None:
        return self.ca_file.read_bytes() if self.ca_file is not None else None


@dataclass(frozen=True)
class OperatorSettings:
    servers: Mapping[str, ServerSettings]


def _server(index: int, table: Any) -> ServerSettings:
    where = f"servers[{index}]"
    if not isinstance(table, dict):
        raise SettingsError(f"{where}: must be a table")
    unknown = sorted(set(table) - _KEYS)
    if unknown:
        raise SettingsError(f"{where}.{unknown[0]}: unknown key")
    name = table.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise SettingsError(f"{where}.name: a lower-case DNS label is required")
    url = table.get("url")
    if not isinstance(url, str) or not re.match(r"^https?://[^/\s]+:\d+/?$", url):
        raise SettingsError(f"{where}.url: http://HOST:PORT or https://HOST:PORT (the gRPC port) is required")
    token_file, token_env = table.get("token_file"), table.get("token_env")
    if (token_file is None) == (token_env is None):
        raise SettingsError(f"{where}: exactly one of token_file and token_env is required")
    for key in ("token_file", "token_env", "ca_file"):
        if key in table and (not isinstance(table[key], str) or not table[key]):
            raise SettingsError(f"{where}.{key}: must be a non-empty string")
    if "ca_file" in table and not url.startswith("https://"):
        raise SettingsError(f"{where}.ca_file: only for an https:// url")
    return ServerSettings(
        name=name,
        url=url.rstrip("/"),
        token_file=Path(token_file) if token_file else None,
        token_env=token_env,
        ca_file=Path(table["ca_file"]) if "ca_file" in table else None,
    )


def parse(text: str) -> OperatorSettings:
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise SettingsError(f"not valid TOML: {error}") from None
    unknown = sorted(set(document) - {"servers"})
    if unknown:
        raise SettingsError(f"{unknown[0]}: unknown key")
    tables = document.get("servers", [])
    if not isinstance(tables, list) or not tables:
        raise SettingsError("servers: at least one [[servers]] table is required")
    servers: dict[str, ServerSettings] = {}
    for index, table in enumerate(tables):
        server = _server(index, table)
        if server.name in servers:
            raise SettingsError(f"servers[{index}].name: {server.name!r} is named twice")
        servers[server.name] = server
    return OperatorSettings(servers)


def load(path: str | os.PathLike[str]) -> OperatorSettings:
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise SettingsError(f"{path}: {error.strerror or error}") from None
    return parse(text)
