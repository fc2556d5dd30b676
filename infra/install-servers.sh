#!/usr/bin/env bash
# Installs the PostgreSQL (15+) and Redis (6.2+) server packages when missing,
# and PgBouncer (the tests check that rota runs behind it).
# The servers themselves are started per test session / demo by infra/devservers.py,
# on free loopback ports in a temporary directory; nothing runs as a system service.
set -euo pipefail

have_postgres() {
  ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || command -v postgres >/dev/null 2>&1
}
have_redis() { command -v redis-server >/dev/null 2>&1; }
have_pgbouncer() { command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ]; }

missing=()
have_postgres || missing+=(postgresql)
have_redis || missing+=(redis-server)
have_pgbouncer || missing+=(pgbouncer)
[ ${#missing[@]} -eq 0 ] && exit 0

echo "installing server packages: ${missing[*]}" >&2
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# policy-rc.d keeps Debian from starting system-wide services we do not want.
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
