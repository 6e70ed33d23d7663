"""Read what a program in a pseudo-terminal shows: its output with terminal escape sequences removed.

``Screen`` wraps a ``pexpect.spawn`` and keeps reading until a condition holds on the text of the
latest full frame (``cronoq top`` starts every frame at the home position, ``ESC [ H``), or on
everything printed so far, failing with the last frame when the program never gets there.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from collections.abc import Callable, Sequence

import pexpect

from tests.server.harness import ROOT

_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07|\x1b[()][0-9A-B]|\x1b[=>78]")
_HOME = "\x1b[H"


def plain(text: str) -> str:
    return _ESCAPES.sub("", text)


class Screen:
    def __init__(self, args: Sequence[str], env: dict[str, str], rows: int = 50, cols: int = 200) -> None:
        self.child = pexpect.spawn(
            sys.executable,
            ["-m", "cronoq.cli", *args],
            env={**env, "TERM": "xterm-256color"},
            cwd=str(ROOT),
            dimensions=(rows, cols),
            encoding="utf-8",
            codec_errors="replace",
        )
        self.raw = ""

    def _read(self, wait: float) -> None:
        with contextlib.suppress(pexpect.TIMEOUT, pexpect.EOF):
            self.raw += self.child.read_nonblocking(1 << 20, timeout=wait)

    def frames(self) -> list[str]:
        """Complete frames so far, oldest first, without escape sequences."""
        parts = self.raw.split(_HOME)
        return [plain(part) for part in parts[1:-1]]

    def wait_frame(self, holds: Callable[[str], bool], what: str, timeout: float = 45.0, since: int = 0) -> str:
        """The first complete frame after frame number ``since`` for which ``holds`` is true."""
        deadline = time.monotonic() + timeout
        while True:
            frames = self.frames()
            for frame in frames[since:]:
                if holds(frame):
                    return frame
            if time.monotonic() > deadline:
                last = frames[-1] if frames else plain(self.raw[-4000:])
                raise AssertionError(f"no frame with {what} within {timeout}s; last frame:\n{last}")
            if not self.child.isalive():
                ended = f"exit {self.child.exitstatus}, signal {self.child.signalstatus}"
                raise AssertionError(f"cronoq ended ({ended}) before {what}:\n{plain(self.raw[-4000:])}")
            self._read(0.2)

    def wait_text(self, text: str, timeout: float = 30.0) -> str:
        """Everything printed so far (escapes removed) once it contains ``text``."""
        deadline = time.monotonic() + timeout
        while text not in plain(self.raw):
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} never shown; got:\n{plain(self.raw[-4000:])}")
            if not self.child.isalive():
                self._read(0.1)
                if text in plain(self.raw):
                    break
                raise AssertionError(f"cronoq exited before showing {text!r}:\n{plain(self.raw[-4000:])}")
            self._read(0.2)
        return plain(self.raw)

    def finish(self, timeout: float = 30.0) -> int:
        """Wait for the program to end; its exit status."""
        self.child.expect(pexpect.EOF, timeout=timeout)
        self.raw += self.child.before or ""
        self.child.close()
        status = self.child.exitstatus
        assert status is not None, f"killed by signal {self.child.signalstatus}"
        return int(status)

    def kill(self) -> None:
        if self.child.isalive():
            self.child.terminate(force=True)


def environment(env: dict[str, str]) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("CRONOQ_")}, **env}
