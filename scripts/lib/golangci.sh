# shellcheck shell=bash
# golangci-lint (github.com/golangci/golangci-lint/v2), pinned, for the lint
# step of scripts/test.sh. Source it, then:
#
#   golangci_install        # sets GOLANGCI_LINT to the binary's path
#   "$GOLANGCI_LINT" run ./...
#
# The binary is built from the Go module proxy (`go install`, which does not
# touch the project's go.mod) into a cache folder keyed by version,
# ${XDG_CACHE_HOME:-$HOME/.cache}/stripe-inbox/golangci-lint/<version>/, outside
# the work tree: CI runs in a fresh clone on the same machine, and building
# golangci-lint is slow (18 minutes once on this shared two-core machine under
# load; 316 s with GOFLAGS=-trimpath on 2026-12-03, also under load), so
# every later run, CI's included, reuses the binary. GOFLAGS=-trimpath is set
# for this one build only (the binary carries no local paths); the project's
# own GOFLAGS do not apply to it.

GOLANGCI_MODULE=github.com/golangci/golangci-lint/v2
GOLANGCI_VERSION=v2.15.0
GOLANGCI_LINT=""

gl__log() { echo "[golangci-lint] $*" >&2; }

golangci_install() {
  local dir="${XDG_CACHE_HOME:-$HOME/.cache}/stripe-inbox/golangci-lint/$GOLANGCI_VERSION"
  GOLANGCI_LINT="$dir/golangci-lint"
  if [ -x "$GOLANGCI_LINT" ]; then
    export GOLANGCI_LINT
    return 0
  fi
  mkdir -p "$dir"
  local tmp start
  tmp=$(mktemp -d "$dir/.install.XXXXXX")
  start=$(date +%s)
  gl__log "building $GOLANGCI_MODULE/cmd/golangci-lint@$GOLANGCI_VERSION into $dir (once per machine)"
  if ! GOBIN="$tmp" GOFLAGS=-trimpath go install "$GOLANGCI_MODULE/cmd/golangci-lint@$GOLANGCI_VERSION"; then
    rm -rf "$tmp"
    return 1
  fi
  # Moved into place only when complete, so an interrupted build is never
  # mistaken for a finished one.
  mv "$tmp/golangci-lint" "$GOLANGCI_LINT"
  rm -rf "$tmp"
  gl__log "built in $(($(date +%s) - start)) s"
  export GOLANGCI_LINT
}
