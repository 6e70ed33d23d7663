#!/usr/bin/env bash
# Make sure Debian's Chromium is at /usr/bin/chromium for the console's browser tests
# (tests/console/). Playwright drives it there; no browser is ever downloaded by Playwright.
#
# As root on Debian/Ubuntu the script installs the `chromium` package quietly. Otherwise it says
# what to install and fails: the browser tests never skip silently.
set -euo pipefail

CHROMIUM=/usr/bin/chromium

if [ -x "$CHROMIUM" ]; then
    exit 0
fi

hint="The console's browser tests need Chromium at $CHROMIUM. Install it with
    sudo apt-get install -y chromium          (Debian)
and run make test again."

if [ "${EUID}" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "$hint" >&2
    exit 1
fi

echo "ensure_chromium: installing Chromium (apt-get install chromium) for the console's browser tests" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends chromium >/dev/null

if [ ! -x "$CHROMIUM" ]; then
    echo "ensure_chromium: chromium was installed but $CHROMIUM is still missing" >&2
    echo "$hint" >&2
    exit 1
fi
