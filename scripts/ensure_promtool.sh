#!/usr/bin/env bash
# Print the path of promtool, for the alert-rule tests (tests/deploy/test_prometheus.py).
#
# promtool on the PATH is used as it is. Otherwise the Debian package `prometheus` is downloaded
# (apt-get download, no installation: no service, no user) and only its promtool is unpacked into
# $CRONOQ_TOOLS (default ~/.cache/cronoq/tools). The path is the last line of output.
set -euo pipefail

if command -v promtool >/dev/null 2>&1; then
    command -v promtool
    exit 0
fi

tools="${CRONOQ_TOOLS:-${HOME:-/tmp}/.cache/cronoq/tools}"
promtool="$tools/prometheus/promtool"
if [ -x "$promtool" ] && "$promtool" --version >/dev/null 2>&1; then
    echo "$promtool"
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg-deb >/dev/null 2>&1; then
    echo "ensure_promtool: promtool is needed; install Prometheus (it ships promtool)," \
         "e.g. apt-get install prometheus, or put promtool on the PATH" >&2
    exit 1
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "ensure_promtool: fetching promtool from Debian's prometheus package" >&2
if ! (cd "$work" && apt-get download prometheus >/dev/null 2>&1); then
    if [ "${EUID}" -ne 0 ]; then
        echo "ensure_promtool: apt-get download prometheus failed; run apt-get update as root first" >&2
        exit 1
    fi
    apt-get update -qq >/dev/null
    (cd "$work" && apt-get download prometheus >/dev/null)
fi
dpkg-deb -x "$work"/prometheus_*.deb "$work/tree"
mkdir -p "$(dirname "$promtool")"
install -m 0755 "$work/tree/usr/bin/promtool" "$promtool"
"$promtool" --version >/dev/null
echo "$promtool"
