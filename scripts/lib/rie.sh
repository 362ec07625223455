# shellcheck shell=bash
# Installs the AWS Lambda Runtime Interface Emulator (aws-lambda-rie), the
# program that serves the Lambda Runtime API to a bootstrap binary the way
# AWS does, and accepts invokes on a local HTTP address. The e2e tests
# (e2e/) run every functions/* binary under it.
#
#   . scripts/lib/rie.sh && rie_install    # prints the binary's path
#   bash scripts/lib/rie.sh                # the same, run directly
#
# The version is pinned here, and only here: the e2e tests call rie_install
# instead of naming a version themselves. It is built from the Go module
# proxy (the emulator is a Go module) into .tmp/bin/ (gitignored), once; a
# binary of another version found there is replaced.

RIE_MODULE=github.com/aws/aws-lambda-runtime-interface-emulator
RIE_VERSION=v0.0.0-20261030222936-bef5c4ba774d

rie__log() { echo "[rie] $*" >&2; }

# rie__current BIN: true when BIN is the pinned version (go version -m reads
# the module version the binary was built from).
rie__current() {
  [ -x "$1" ] || return 1
  go version -m "$1" 2>/dev/null | awk -v m="$RIE_MODULE" -v v="$RIE_VERSION" \
    '$1 == "mod" && $2 == m && $3 == v { found = 1 } END { exit !found }'
}

# rie_install: installs the pinned emulator into <repo>/.tmp/bin if it is not
# there yet and prints its absolute path on stdout (progress goes to stderr).
rie_install() {
  command -v go >/dev/null 2>&1 || { rie__log "Go is required to install the emulator"; return 1; }
  local root dir bin tmp
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd) || return 1
  dir="$root/.tmp/bin"
  bin="$dir/aws-lambda-rie"
  if rie__current "$bin"; then
    echo "$bin"
    return 0
  fi
  mkdir -p "$dir" || return 1
  # Install beside the final path and rename, so that two concurrent installs
  # (two test runs) never leave a half-written binary behind.
  tmp=$(mktemp -d "$dir/.rie-install.XXXXXX") || return 1
  rie__log "installing $RIE_MODULE/cmd/aws-lambda-rie@$RIE_VERSION into $dir"
  # GOFLAGS is cleared so that a project's -mod=... cannot break `go install
  # pkg@version`; the emulator needs no cgo.
  if ! GOBIN="$tmp" GOFLAGS="" CGO_ENABLED=0 go install "$RIE_MODULE/cmd/aws-lambda-rie@$RIE_VERSION" >&2; then
    rm -rf "$tmp"
    rie__log "go install failed (the Go module proxy must be reachable)"
    return 1
  fi
  mv -f "$tmp/aws-lambda-rie" "$bin" && rmdir "$tmp" || return 1
  echo "$bin"
}

# Run directly (not sourced): install and print the path.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  rie_install
fi
