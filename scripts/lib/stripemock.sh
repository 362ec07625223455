# shellcheck shell=bash
# Installs stripe-mock, Stripe's own mock of its API (it answers from Stripe's
# OpenAPI specification, so its objects have Stripe's shapes). The reconciler's
# tests decode its GET /v1/events with the reconciler's client.
#
#   . scripts/lib/stripemock.sh && stripemock_install    # prints the binary's path
#   bash scripts/lib/stripemock.sh                       # the same, run directly
#
# The version is pinned here, and only here. It is built from the Go module
# proxy (stripe-mock is a Go module) into .tmp/bin/ (gitignored), once; a
# binary of another version found there is replaced.

STRIPEMOCK_MODULE=github.com/stripe/stripe-mock
STRIPEMOCK_VERSION=v0.203.0

stripemock__log() { echo "[stripe-mock] $*" >&2; }

stripemock__current() {
  [ -x "$1" ] || return 1
  go version -m "$1" 2>/dev/null | awk -v m="$STRIPEMOCK_MODULE" -v v="$STRIPEMOCK_VERSION" \
    '$1 == "mod" && $2 == m && $3 == v { found = 1 } END { exit !found }'
}

stripemock_install() {
  command -v go >/dev/null 2>&1 || { stripemock__log "Go is required to install stripe-mock"; return 1; }
  local root dir bin tmp
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd) || return 1
  dir="$root/.tmp/bin"
  bin="$dir/stripe-mock"
  if stripemock__current "$bin"; then
    echo "$bin"
    return 0
  fi
  mkdir -p "$dir" || return 1
  # Beside the final path, then renamed: concurrent installs never leave a
  # half-written binary.
  tmp=$(mktemp -d "$dir/.stripemock-install.XXXXXX") || return 1
  stripemock__log "installing $STRIPEMOCK_MODULE@$STRIPEMOCK_VERSION into $dir"
  if ! GOBIN="$tmp" GOFLAGS="" CGO_ENABLED=0 go install "$STRIPEMOCK_MODULE@$STRIPEMOCK_VERSION" >&2; then
    rm -rf "$tmp"
    stripemock__log "go install failed (the Go module proxy must be reachable)"
    return 1
  fi
  mv -f "$tmp/stripe-mock" "$bin" && rmdir "$tmp" || return 1
  echo "$bin"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  stripemock_install
fi
