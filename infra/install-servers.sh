#!/usr/bin/env bash
# `make install`: the server packages `make test` needs, when missing. The
# PostgreSQL (15+) and Redis (6.2+) servers, PgBouncer (the tests check that
# rota runs behind it), Chromium with its driver (the console's browser tests
# drive it headless through Selenium), Java (Spark's loader and its tests) and
# PostgreSQL's JDBC driver (the import benchmark's baseline).
# The servers themselves are started per test session by
# tools/rota_tools/devservers.py, on free loopback ports in a temporary
# directory; nothing runs as a system service. Developing an app needs none of
# this: `rota dev` runs PostgreSQL and Redis from the `embedded` extra's wheels.
set -euo pipefail

have_postgres() {
  ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || command -v postgres >/dev/null 2>&1
}
have_redis() { command -v redis-server >/dev/null 2>&1; }
have_pgbouncer() { command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ]; }
have_chromium() { command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; }
have_jdbc() { [ -e /usr/share/java/postgresql.jar ]; }
have_java() { command -v java >/dev/null 2>&1; }

missing=()
have_postgres || missing+=(postgresql)
have_redis || missing+=(redis-server)
have_pgbouncer || missing+=(pgbouncer)
have_chromium || missing+=(chromium chromium-driver)
have_java || missing+=(default-jre-headless)
have_jdbc || missing+=(libpostgresql-jdbc-java)  # `rota bench import`'s plain JDBC write
[ ${#missing[@]} -eq 0 ] && exit 0

echo "installing server packages: ${missing[*]}" >&2
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
# Debian starts an installed server as a system service unless policy-rc.d
# says no; rota starts its own per test session on free ports. Machines of
# this kind have one; elsewhere a refusing one stands in during the install.
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
  $SUDO chmod +x /usr/sbin/policy-rc.d
  trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
fi
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
