"""Debian's Chromium under Playwright for the console's tests.

``CHROMIUM`` is the one browser used: Playwright never downloads one here. ``make test`` installs
it first (``scripts/ensure_chromium.sh``); without it the tests fail and say so, never skip.
Screenshots go to ``build/screenshots/`` and their paths are printed.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from playwright.async_api import BrowserContext, Page, async_playwright

CHROMIUM = "/usr/bin/chromium"
ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "build" / "screenshots"
VIEWPORT = {"width": 1280, "height": 900}
WRITTEN: list[Path] = []
"""Screenshots written in this run (``conftest.py`` lists them in pytest's summary)."""


@asynccontextmanager
async def chromium() -> AsyncIterator[BrowserContext]:
    """A fresh browser profile of Debian's Chromium, closed (and deleted) afterwards."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(
            f"the console's browser tests need Chromium at {CHROMIUM}: run scripts/ensure_chromium.sh "
            "(as root it installs Debian's chromium package) or apt-get install chromium"
        )
    with tempfile.TemporaryDirectory(prefix="cronoq-chromium-") as profile:
        async with async_playwright() as playwright:
            context = await playwright.chromium.launch_persistent_context(
                profile,
                executable_path=CHROMIUM,
                args=list(ARGS),
                headless=True,
                viewport={"width": 1280, "height": 900},
            )
            try:
                yield context
            finally:
                await context.close()


async def screenshot(page: Page, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    WRITTEN.append(path)
    return path


async def sign_in(context: BrowserContext, base: str, token: str, view: str = "") -> Page:
    """A new tab (its own sessionStorage) signed in with ``token`` through the page's form."""
    page = await context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.errors = errors  # type: ignore[attr-defined]
    await page.goto(f"{base}/ui/")
    await page.fill("#token", token)
    await page.click("#sign-in button[type=submit]")
    await page.wait_for_selector("#who[data-role]")
    if view:
        await page.goto(f"{base}/ui/#/{view}")
    return page
