# shellcheck shell=bash
# Finds or starts the PostgreSQL that the project's scripts use. Source it and
# call pg_find_or_start VAR_NAME: it exports VAR_NAME as a server URL (the
# "postgres" database) and, when it had to start a throwaway cluster, stops
# and removes that cluster when the calling script exits.
#
# Order: the variable itself when set, then DATABASE_URL, then a server on
# 127.0.0.1:5432 that accepts user postgres, then a throwaway cluster made
# with initdb/pg_ctl from the installed binaries in a temporary folder (run as
# user postgres when this script runs as root). When no binaries are
# installed and we are root, Debian's postgresql package is installed first.

pg__log() { echo "[postgres] $*" >&2; }

pg__bindir() {
  local d
  if command -v pg_config >/dev/null 2>&1 && [ -x "$(pg_config --bindir)/initdb" ]; then
    pg_config --bindir; return 0
  fi
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    [ -x "$d/initdb" ] && { echo "$d"; return 0; }
  done
  return 1
}

pg__install() {
  if [ "$(id -u)" != 0 ]; then
    pg__log "no PostgreSQL binaries found; install them (apt-get install postgresql) and re-run"
    return 1
  fi
  pg__log "installing PostgreSQL from Debian's packages"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null && apt-get install -y -qq postgresql postgresql-client >/dev/null
}

pg__free_port() {
  local port
  for port in $(seq "${1:-55432}" 55532); do
    if ! (exec 3<>/dev/tcp/127.0.0.1/"$port") 2>/dev/null; then echo "$port"; return 0; fi
  done
  return 1
}

pg__as_owner() {
  if [ "$(id -u)" = 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

PG_THROWAWAY_DIR=""
pg_stop_throwaway() {
  [ -n "$PG_THROWAWAY_DIR" ] || return 0
  pg__log "stopping throwaway cluster in $PG_THROWAWAY_DIR"
  pg__as_owner "$PG_BINDIR/pg_ctl" -D "$PG_THROWAWAY_DIR/data" -m fast -w stop >/dev/null 2>&1 || true
  rm -rf "$PG_THROWAWAY_DIR"
  PG_THROWAWAY_DIR=""
}

# pg_start_throwaway [extra postgres -c settings...]: starts a cluster and
# sets PG_THROWAWAY_URL (call it directly, not in $(...), so that
# pg_stop_throwaway can find the cluster). Used by pg_find_or_start and by suites that must own (and
# crash) their own server.
#
# PG_THROWAWAY_BINDIR, when set, is the folder of the initdb, pg_ctl and
# postgres to use instead of the installed ones (scripts/lib/postgres18.sh).
pg_start_throwaway() {
  if [ -n "${PG_THROWAWAY_BINDIR:-}" ]; then
    PG_BINDIR=$PG_THROWAWAY_BINDIR
  else
    PG_BINDIR=$(pg__bindir) || { pg__install && PG_BINDIR=$(pg__bindir); } || return 1
  fi
  local port dir opts
  port=$(pg__free_port) || { pg__log "no free port"; return 1; }
  dir=$(mktemp -d /tmp/inbox-pg.XXXXXX)
  chmod 755 "$dir"
  [ "$(id -u)" = 0 ] && chown postgres "$dir"
  pg__as_owner "$PG_BINDIR/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --no-sync >"$dir/initdb.log" 2>&1 \
    || { cat "$dir/initdb.log" >&2; return 1; }
  # A port that looked free can be taken before the server binds it (another
  # suite starting at the same moment): then try the next one.
  local try
  for try in 1 2 3 4 5; do
    opts="-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=300"
    for o in "$@"; do opts="$opts -c $o"; done
    if pg__as_owner "$PG_BINDIR/pg_ctl" -D "$dir/data" -l "$dir/server.log" -o "$opts" -w -t 60 start >/dev/null; then
      break
    fi
    if [ "$try" = 5 ] || ! grep -q "could not bind\|could not create any TCP/IP sockets" "$dir/server.log"; then
      cat "$dir/server.log" >&2; return 1
    fi
    port=$(pg__free_port "$((port + 1))") || { pg__log "no free port"; return 1; }
  done
  PG_THROWAWAY_DIR=$dir
  PG_THROWAWAY_PORT=$port
  export PG_BINDIR PG_THROWAWAY_DIR PG_THROWAWAY_PORT
  pg__log "started throwaway PostgreSQL $("$PG_BINDIR/postgres" --version | awk '{print $3}') on 127.0.0.1:$port ($dir)"
  PG_THROWAWAY_URL="postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable"
  export PG_THROWAWAY_URL
}

pg__answers() {
  command -v psql >/dev/null 2>&1 || return 1
  PGCONNECT_TIMEOUT=3 psql "$1" -XAtqc 'SELECT 1' >/dev/null 2>&1
}

# PG_THROWAWAY=1 skips the first three and always starts a throwaway cluster
# (what a machine without a running server gets).
pg_find_or_start() {
  local var=$1 url
  if [ "${PG_THROWAWAY:-0}" != 1 ]; then
    url=${!var:-${DATABASE_URL:-}}
    if [ -n "$url" ]; then
      export "$var=$url"; return 0
    fi
  fi
  url="postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
  if [ "${PG_THROWAWAY:-0}" != 1 ] && pg__answers "$url"; then
    pg__log "using the PostgreSQL on 127.0.0.1:5432"
    export "$var=$url"; return 0
  fi
  if [ "${PG_THROWAWAY:-0}" = 1 ]; then
    pg__log "PG_THROWAWAY=1: starting a throwaway cluster"
  else
    pg__log "nothing answers on 127.0.0.1:5432; starting a throwaway cluster"
  fi
  # fsync off: a test cluster is thrown away, and its durability is not what is tested.
  trap pg_stop_throwaway EXIT
  trap 'exit 130' INT TERM
  pg_start_throwaway fsync=off synchronous_commit=off full_page_writes=off || return 1
  export "$var=$PG_THROWAWAY_URL"
}
