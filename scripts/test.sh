#!/usr/bin/env bash
# The one test command: every test of the project, against a real PostgreSQL.
#
#   scripts/test.sh              # vet + all tests (race detector on)
#   scripts/test.sh ./internal/webhook/...   # only these packages
#
# PostgreSQL: TEST_DATABASE_URL, else DATABASE_URL, else the server on
# 127.0.0.1:5432, else a throwaway cluster started (and removed) here.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/postgres.sh
. scripts/lib/postgres.sh

command -v go >/dev/null || { echo "Go is required (go1.26+)" >&2; exit 1; }
pg_find_or_start TEST_DATABASE_URL
export TEST_DATABASE_URL

pkgs=("$@")
[ ${#pkgs[@]} -gt 0 ] || pkgs=(./...)

echo "== gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './infra/node_modules/*'))
if [ -n "$unformatted" ]; then echo "gofmt would change:"; echo "$unformatted"; exit 1; fi

echo "== go vet"
go vet "${pkgs[@]}"

echo "== go test -race"
go test -race -count=1 -timeout 30m "${pkgs[@]}"
