"""Writing text that other clients of the server control (keys, messages, names, outputs).

On a terminal, control characters could move the cursor, change colours or retitle the window,
so they are shown as escapes such as ``\\u{1b}``. Redirected output is left exactly as the server
sent it, because a file or a pipe is read by a program, not by a terminal.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any, BinaryIO, TextIO

# C0 and C1 controls, DEL, lone surrogates (undecodable bytes) and the bidirectional overrides,
# which can make a terminal show text in another order than it is.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_UNSAFE_KEEP_LINES = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)
# What json.dumps(ensure_ascii=False) leaves raw but a terminal would still act on.
_UNSAFE_IN_JSON = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:  # an undecodable byte, carried by the surrogateescape handler
        return f"\\x{{{code - 0xDC00:02x}}}"
    return f"\\u{{{code:x}}}"


def escape_controls(text: str, *, keep_lines: bool = False) -> str:
    """``text`` with control characters written as ``\\u{..}``; newlines and tabs kept if asked."""
    pattern = _UNSAFE_KEEP_LINES if keep_lines else _UNSAFE
    return pattern.sub(_escape, text)


def dumps_json(value: Any) -> str:
    """One JSON document, UTF-8 text kept readable, with nothing a terminal would interpret."""
    try:
        text = json.dumps(value, ensure_ascii=False)
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate inside a worker's JSON output
        return json.dumps(value)
    return _UNSAFE_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


class Out:
    """Standard output and error, each escaping server text only when it is a terminal."""

    def __init__(self, stdout: TextIO | None = None, stderr: TextIO | None = None) -> None:
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        self.stdout_tty = _isatty(self.stdout)
        self.stderr_tty = _isatty(self.stderr)

    def safe(self, text: str) -> str:
        """A one-line field from the server, as it may be shown on standard output."""
        return escape_controls(text) if self.stdout_tty else text

    def line(self, text: str = "") -> None:
        """A line already made safe (tables are built from ``safe`` fields)."""
        self.stdout.write(text + "\n")
        self.stdout.flush()

    def json(self, value: Any) -> None:
        self.line(dumps_json(value))

    def note(self, text: str) -> None:
        """A message for the person running the command, on standard error."""
        self.stderr.write((escape_controls(text, keep_lines=True) if self.stderr_tty else text) + "\n")
        self.stderr.flush()

    def warn(self, text: str) -> None:
        self.note(f"warning: {text}")

    def payload(self, data: bytes) -> None:
        """A task's output: byte for byte when redirected; readable and harmless on a terminal."""
        if not self.stdout_tty:
            self.stdout.flush()
            binary: BinaryIO = getattr(self.stdout, "buffer", None) or _fallback_binary(self.stdout)
            binary.write(data)
            binary.flush()
            return
        text = escape_controls(data.decode("utf-8", errors="surrogateescape"), keep_lines=True)
        if text and not text.endswith("\n"):
            text += "\n"  # keep the shell prompt on a line of its own
        self.stdout.write(text)
        self.stdout.flush()


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class _TextAsBinary:
    """For a text stream without ``.buffer`` (captured output): bytes written as UTF-8 text."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, data: bytes) -> int:
        self.stream.write(data.decode("utf-8", errors="replace"))
        return len(data)

    def flush(self) -> None:
        self.stream.flush()


def _fallback_binary(stream: TextIO) -> BinaryIO:
    return _TextAsBinary(stream)  # type: ignore[return-value]
