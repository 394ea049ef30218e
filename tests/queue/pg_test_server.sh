#!/usr/bin/env bash
# A private PostgreSQL server for the tests: initdb + pg_ctl in a fresh directory under /tmp,
# reachable only through a unix socket in that directory (no TCP port, so it can never collide
# with another server), tuned for speed over durability (fsync off).
#   pg_test_server.sh start STATE_DIR   start one unless STATE_DIR/env names a running one
#   pg_test_server.sh stop STATE_DIR    stop it and remove its directory
# STATE_DIR/env then holds MB_PG_ROOT, MB_PG_HOST (the socket directory), MB_PG_PORT and
# MB_PG_USER for the tests. PostgreSQL refuses to run as root: as root the server runs as user
# `nobody` (runuser), which owns the directory. Concurrent callers are serialized by flock (the
# server must not inherit the lock's descriptor, or it would hold the lock for its lifetime).
set -euo pipefail
cmd=${1:?usage: pg_test_server.sh start|stop STATE_DIR}
state=${2:?usage: pg_test_server.sh start|stop STATE_DIR}
mkdir -p "$state"
exec 9>"$state/lock"
flock 9

bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
if [ -z "$bindir" ] || [ ! -x "$bindir/initdb" ]; then
  echo "pg_test_server: no PostgreSQL server under /usr/lib/postgresql/*/bin" \
       "(bash scripts/deps.sh installs it)" >&2
  exit 1
fi
as_owner=()
owner=$(id -un)
if [ "$(id -u)" -eq 0 ]; then
  owner=nobody
  if ! id "$owner" >/dev/null 2>&1; then
    echo "pg_test_server: running as root and there is no user '$owner' to run PostgreSQL" >&2
    exit 1
  fi
  as_owner=(runuser -u "$owner" --)
fi

running() {
  [ -f "$state/env" ] || return 1
  # shellcheck disable=SC1091
  . "$state/env"
  "${as_owner[@]}" "$bindir/pg_ctl" status -D "$MB_PG_ROOT/data" >/dev/null 2>&1
}

case "$cmd" in
  start)
    if running; then exit 0; fi
    if [ -f "$state/env" ]; then rm -rf "$MB_PG_ROOT"; rm -f "$state/env"; fi
    root=$(mktemp -d /tmp/moebatch-pg.XXXXXX)
    chmod 755 "$root"
    [ "$(id -u)" -eq 0 ] && chown "$owner" "$root"
    if ! "${as_owner[@]}" "$bindir/initdb" -D "$root/data" -U moebatch -A trust -E UTF8 \
         --no-locale --no-sync >"$root/initdb.log" 2>&1; then
      cat "$root/initdb.log" >&2
      rm -rf "$root"
      exit 1
    fi
    if ! "${as_owner[@]}" "$bindir/pg_ctl" start -D "$root/data" -l "$root/server.log" -w -t 60 \
         -o "-k '$root' -c listen_addresses='' -p 5432 -c fsync=off -c synchronous_commit=off \
             -c full_page_writes=off -c max_connections=200 -c shared_buffers=32MB" \
         >/dev/null 9>&-; then
      cat "$root/server.log" >&2 || true
      rm -rf "$root"
      exit 1
    fi
    cat >"$state/env.tmp" <<ENV
MB_PG_ROOT=$root
MB_PG_HOST=$root
MB_PG_PORT=5432
MB_PG_USER=moebatch
ENV
    mv "$state/env.tmp" "$state/env"
    echo "pg_test_server: PostgreSQL $("$bindir/postgres" --version | awk '{print $3}') on $root"
    ;;
  stop)
    if [ -f "$state/env" ]; then
      # shellcheck disable=SC1091
      . "$state/env"
      "${as_owner[@]}" "$bindir/pg_ctl" stop -D "$MB_PG_ROOT/data" -m fast -w >/dev/null 2>&1 || true
      rm -rf "$MB_PG_ROOT"
      rm -f "$state/env"
    fi
    ;;
  *)
    echo "usage: pg_test_server.sh start|stop STATE_DIR" >&2
    exit 2
    ;;
esac
