#!/usr/bin/env bash
# Make sure a Docker daemon answers, for the image tests (tests/deploy/test_image.py) and
# `make image`.
#
# A daemon that already answers is used as it is. Otherwise, as root on Debian/Ubuntu, the script
# installs the `docker.io` package when dockerd is missing and starts dockerd in the background
# without a bridge network or iptables rules: the tests run containers with --network host and
# build with --network none, so nothing needs a network of Docker's own. Its log goes to
# $CRONOQ_DOCKERD_LOG (default /var/log/cronoq-dockerd.log); stop it with
# `kill "$(cat /var/run/cronoq-dockerd.pid)"`.
set -euo pipefail

log="${CRONOQ_DOCKERD_LOG:-/var/log/cronoq-dockerd.log}"
pidfile=/var/run/cronoq-dockerd.pid

answers() {
    command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1
}

if answers; then
    exit 0
fi

hint="A Docker daemon is needed by the image tests. Install and start one, e.g.
    sudo apt-get install -y docker.io && sudo systemctl start docker     (Debian/Ubuntu)
or run this script as root, which installs docker.io and starts dockerd itself."

if [ "${EUID}" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "$hint" >&2
    exit 1
fi

if ! command -v dockerd >/dev/null 2>&1; then
    echo "ensure_docker: installing Docker (apt-get install docker.io) for the image tests" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends docker.io >/dev/null
fi

if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    echo "ensure_docker: dockerd (pid $(cat "$pidfile")) is running but does not answer yet" >&2
else
    echo "ensure_docker: starting dockerd (log: $log)" >&2
    mkdir -p "$(dirname "$log")"
    # setsid: the daemon outlives the make or pytest run that started it, like a system service.
    setsid dockerd --bridge=none --iptables=false --ip6tables=false --ip-masq=false \
        --pidfile "$pidfile" >>"$log" 2>&1 </dev/null &
fi

for _ in $(seq 1 120); do
    if answers; then
        exit 0
    fi
    sleep 0.5
done
echo "ensure_docker: dockerd did not answer within 60 s; its log ($log) ends with:" >&2
tail -n 20 "$log" >&2 || true
exit 1
