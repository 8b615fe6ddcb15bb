#!/usr/bin/env bash
# Installs the database server that tests/test_journal_postgres.py (and
# benches/python/journal_postgres.py) run a journal against: Debian's own `postgresql`, once.
#
#   .ci/postgresql-from-debian.sh
#
# Only the binaries are used: the tests start a throwaway cluster of their own in a temporary
# folder, on 127.0.0.1 and a free port, as the `postgres` user the package makes (the server
# refuses to run as root, and CI runs as root), and stop it at the end (tests/_postgres.py). The
# cluster the package itself creates and starts is left alone. Safe to rerun: with the server's
# binaries present it does nothing. It needs root to install (CI runs as root); without root, or
# where apt cannot install it, it says so and succeeds, and the PostgreSQL tests skip, saying why.
set -euo pipefail

if compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
    exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
    echo "postgresql-from-debian: not root, so PostgreSQL is not installed: its tests will skip" >&2
    exit 0
fi
# The lock may be held by another apt run (an unattended upgrade): wait for it, not fail.
apt_get=(apt-get -o DPkg::Lock::Timeout=600 -q)
if ! { "${apt_get[@]}" update >/dev/null &&
    DEBIAN_FRONTEND=noninteractive "${apt_get[@]}" install -y --no-install-recommends \
        postgresql >/dev/null; }; then
    echo "postgresql-from-debian: apt-get could not install postgresql: its tests will skip" >&2
fi
