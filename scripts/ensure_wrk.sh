#!/usr/bin/env bash
# Make sure wrk (the C HTTP load generator) is on the PATH for loadtests/producer_bench.py's
# http_wrk_c64 case. As root on Debian/Ubuntu it installs the `wrk` package quietly; otherwise it
# says what to install. Without wrk that case reports itself skipped and the others still run,
# so this never fails the bench.
set -uo pipefail

if command -v wrk >/dev/null 2>&1; then
    exit 0
fi
if [ "${EUID}" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure_wrk: wrk is not installed; the http_wrk_c64 case will be skipped" \
         "(install it with: sudo apt-get install -y wrk)" >&2
    exit 0
fi
echo "ensure_wrk: installing wrk (apt-get install wrk) for the HTTP submit benchmark" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq --no-install-recommends wrk >/dev/null 2>&1 \
    || { apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends wrk >/dev/null; } \
    || echo "ensure_wrk: could not install wrk; the http_wrk_c64 case will be skipped" >&2
exit 0
