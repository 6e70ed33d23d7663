"""The cluster's bearer tokens: one random token per role, kept in ``<state>/tokens.env``.

The file holds ``export CRONOQ_<ROLE>_TOKEN=<value>`` lines, so ``source <state>/tokens.env`` puts
them in a shell. It is created owner-only (mode 0600). A later ``up`` on the same state folder
reuses the tokens, so a shell that sourced the file keeps working.
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

from .layout import ROLES, token_env

__all__ = ["load_or_create_tokens", "read_tokens", "write_tokens"]

_LINE = re.compile(r"export ([A-Z_][A-Z0-9_]*)=([A-Za-z0-9_\-]+)")
_TOKEN_BYTES = 24  # 48 hex characters, well above the 32 the server asks for


def read_tokens(path: Path) -> dict[str, str]:
    """Variable name -> token from a tokens file; ``{}`` when the file does not exist."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    found: dict[str, str] = {}
    for line in text.splitlines():
        match = _LINE.fullmatch(line.strip())
        if match:
            found[match.group(1)] = match.group(2)
    return found


def write_tokens(path: Path, tokens: dict[str, str]) -> None:
    """Write (or replace) the file owner-only; the tokens never exist in a world-readable file."""
    body = "".join(f"export {name}={value}\n" for name, value in tokens.items())
    temporary = path.with_name(path.name + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # the umask cannot widen it, but an older file could be wider
        os.write(fd, body.encode())
    finally:
        os.close(fd)
    os.replace(temporary, path)


def load_or_create_tokens(path: Path) -> dict[str, str]:
    """The tokens of every role: kept from ``path`` when present, new random ones otherwise."""
    existing = read_tokens(path)
    tokens = {token_env(role): existing.get(token_env(role)) or secrets.token_hex(_TOKEN_BYTES) for role in ROLES}
    if tokens != existing or (path.stat().st_mode & 0o777) != 0o600:
        write_tokens(path, tokens)
    return tokens
