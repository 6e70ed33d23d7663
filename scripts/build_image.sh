#!/usr/bin/env bash
# Build the cronoq container image (`make image`; the image tests call it too).
#
#   scripts/build_image.sh                 # tags cronoq:dev on the local base cronoq-base:bookworm
#   CRONOQ_IMAGE=cronoq:x CRONOQ_IMAGE_BASE=python:3.11-slim-bookworm scripts/build_image.sh
#
# No container registry may be reachable, so by default the image is built on a local base:
# Debian bookworm with python3 and python3-venv, made with debootstrap from Debian's packages and
# imported into Docker as cronoq-base:bookworm (made once, then reused). The wheels of every
# dependency (of the server and operator extras) and of the build backend are fetched here with
# pip into build/wheelhouse, and `docker build --network none` installs only from them. The
# Dockerfile alone (`docker build -t cronoq .`) uses the official slim Python image and PyPI.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
image="${CRONOQ_IMAGE:-cronoq:dev}"
local_base="cronoq-base:bookworm"
base="${CRONOQ_IMAGE_BASE:-$local_base}"
python="${PYTHON:-}"
if [ -z "$python" ]; then
    if [ -x "$root/.venv/bin/python" ]; then python="$root/.venv/bin/python"; else python=python3; fi
fi

bash "$root/scripts/ensure_docker.sh"

make_local_base() {
    if [ "${EUID}" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        echo "build_image: the base image $local_base is missing and is built with debootstrap," \
             "which needs root on Debian/Ubuntu; or set CRONOQ_IMAGE_BASE to a Python 3.11+ image" >&2
        exit 1
    fi
    if ! command -v debootstrap >/dev/null 2>&1; then
        echo "build_image: installing debootstrap (apt-get install debootstrap)" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >/dev/null
        apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
    fi
    local tree
    tree="$(mktemp -d /var/tmp/cronoq-base.XXXXXX)"
    trap 'rm -rf "$tree"' RETURN
    echo "build_image: making $local_base with debootstrap (Debian bookworm, python3; about a minute)" >&2
    debootstrap --variant=minbase --include=python3,python3-venv bookworm "$tree/rootfs" \
        http://deb.debian.org/debian >"$tree/debootstrap.log" 2>&1 || {
        tail -n 20 "$tree/debootstrap.log" >&2
        exit 1
    }
    # What a runtime never reads: package caches and lists, documentation, translations.
    rm -rf "$tree/rootfs"/var/cache/apt/archives/*.deb "$tree/rootfs"/var/lib/apt/lists/* \
        "$tree/rootfs"/usr/share/doc/* "$tree/rootfs"/usr/share/man/* "$tree/rootfs"/usr/share/info/* \
        "$tree/rootfs"/usr/share/locale/*
    tar -C "$tree/rootfs" -c . | docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["/bin/bash"]' \
        --message "Debian bookworm minbase with python3 and python3-venv (debootstrap)" \
        - "$local_base" >/dev/null
    echo "build_image: $local_base made in ${SECONDS}s" >&2
}

if [ "$base" = "$local_base" ] && ! docker image inspect "$local_base" >/dev/null 2>&1; then
    make_local_base
fi

wheelhouse="$root/build/wheelhouse"
mkdir -p "$wheelhouse"
wheels() {
    (cd "$root" && "$python" -m pip wheel --quiet --wheel-dir "$wheelhouse" "$@" '.[server,operator]' \
        'setuptools>=68' wheel) >"$root/build/wheelhouse.log" 2>&1
}
echo "build_image: the dependencies' wheels in build/wheelhouse" >&2
# Fetched again only when the dependencies may have changed: from the wheels already there when
# they suffice (offline), else from the index.
stamp="$wheelhouse/.complete"
if [ ! -f "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ]; then
    if ! wheels --no-index --find-links "$wheelhouse" && ! wheels; then
        tail -n 30 "$root/build/wheelhouse.log" >&2
        exit 1
    fi
    touch "$stamp"
    echo "build_image: wheels ready after ${SECONDS}s" >&2
fi
# The image builds cronoq itself from the sources in the build context (which .dockerignore
# selects), so a folder missing there fails the build instead of going unnoticed.
rm -f "$wheelhouse"/cronoq-*.whl

echo "build_image: docker build -t $image (base $base)" >&2
# The legacy builder is what every docker.io ships; BuildKit, when present, builds it the same.
if ! DOCKER_BUILDKIT="${DOCKER_BUILDKIT:-0}" docker build --network none \
        --build-arg "PYTHON_IMAGE=$base" -t "$image" "$root" >"$root/build/docker-build.log" 2>&1; then
    tail -n 40 "$root/build/docker-build.log" >&2
    exit 1
fi
# The builder leaves superseded images behind untagged: runtime ones go at once, build stages
# (the layer cache of the dependencies) after a day.
docker image prune --force --filter label=io.cronoq.stage=runtime >/dev/null
docker image prune --force --filter label=io.cronoq.stage=build --filter until=24h >/dev/null
size="$(docker image inspect -f '{{.Size}}' "$image")"
echo "build_image: $image is $((size / 1000000)) MB, built in ${SECONDS}s" >&2
