#!/usr/bin/env bash
# Make sure the PostgreSQL server binaries (initdb, pg_ctl) that the store tests need are present.
# The tests start their own throwaway cluster with them (see tests/conftest.py); with
# CRONOQ_TEST_DSN set they use that database instead and need no binaries.
#
# As root on Debian/Ubuntu the script installs the `postgresql` package quietly, without letting
# it create the default cluster. Otherwise it says what to install and fails.
set -euo pipefail

if [ -n "${CRONOQ_TEST_DSN:-}" ]; then
    exit 0
fi

have_binaries() {
    local dir
    if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
        return 0
    fi
    if command -v pg_config >/dev/null 2>&1; then
        dir="$(pg_config --bindir 2>/dev/null || true)"
        if [ -n "$dir" ] && [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ]; then
            return 0
        fi
    fi
    for dir in /usr/lib/postgresql/*/bin; do
        if [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ]; then
            return 0
        fi
    done
    return 1
}

if have_binaries; then
    exit 0
fi

hint="PostgreSQL server binaries (initdb, pg_ctl) are needed by the store tests. Install them with
    sudo apt-get install -y postgresql        (Debian/Ubuntu)
    sudo dnf install -y postgresql-server     (Fedora/RHEL)
    brew install postgresql                   (macOS)
or set CRONOQ_TEST_DSN to a database where the tests may create schemas."

if [ "${EUID}" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "$hint" >&2
    exit 1
fi

echo "ensure_postgres: installing PostgreSQL (apt-get install postgresql) for the store tests" >&2
# The tests run private clusters; keep the package from creating and starting its own.
if [ ! -e /etc/postgresql-common/createcluster.conf ]; then
    mkdir -p /etc/postgresql-common
    echo "create_main_cluster = false" > /etc/postgresql-common/createcluster.conf
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends postgresql >/dev/null

if ! have_binaries; then
    echo "ensure_postgres: postgresql was installed but initdb/pg_ctl are still not found" >&2
    echo "$hint" >&2
    exit 1
fi
