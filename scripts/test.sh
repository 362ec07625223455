#!/usr/bin/env bash
# The one test command: every test of the project, against a real PostgreSQL.
#
#   scripts/test.sh                          everything (what CI runs)
#   scripts/test.sh ./internal/webhook/...   only these Go packages (gofmt, vet, test)
#   SKIP_PG18=1 scripts/test.sh              everything but the PostgreSQL 18 pass
#
# Steps: gofmt, the relative links of README.md and docs/, go vet, golangci-lint (.golangci.yml), go test -race (unit,
# real-PostgreSQL, real-process and emulator tests, CDK template and cdk-nag
# tests), the benchmark's smoke run (scripts/bench.sh --quick), the database
# suites again on PostgreSQL 18, the Lambda build and an offline `cdk synth`,
# and the short fault-injection suite.
#
# PostgreSQL: TEST_DATABASE_URL, else DATABASE_URL, else the server on
# 127.0.0.1:5432, else a throwaway cluster started (and removed) here. The
# PostgreSQL 18 pass always starts its own throwaway cluster
# (scripts/lib/postgres18.sh, from a pinned npm package cached per machine).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/postgres.sh
. scripts/lib/postgres.sh
# shellcheck source=lib/golangci.sh
. scripts/lib/golangci.sh

command -v go >/dev/null || { echo "Go is required (go1.26+)" >&2; exit 1; }
pg_find_or_start TEST_DATABASE_URL
export TEST_DATABASE_URL
# jsii (CDK in Go) warns on Node 20, past its support window; the CDK CLI
# and library pinned here run on it.
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION=${JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION:-20}

all=1
pkgs=("$@")
if [ ${#pkgs[@]} -gt 0 ]; then all=0; else pkgs=(./...); fi

step() { echo; echo "== $*"; }

step gofmt
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './infra/node_modules/*'))
if [ -n "$unformatted" ]; then echo "gofmt would change:"; echo "$unformatted"; exit 1; fi

step "links in README.md and docs/ resolve"
go run ./scripts/doclinks README.md docs

step go vet
go vet "${pkgs[@]}"

if [ "$all" = 1 ]; then
  step "golangci-lint (built once per machine into ~/.cache/stripe-inbox)"
  golangci_install
  "$GOLANGCI_LINT" run ./...
fi

step "go test -race"
if [ "$all" = 1 ]; then
  # The e2e suite's cold starts, for the benchmark's smoke run below.
  mkdir -p .tmp
  rm -f .tmp/coldstart-test.md
  export E2E_REPORT="$PWD/.tmp/coldstart-test.md"
fi
go test -race -count=1 -timeout 30m "${pkgs[@]}"

[ "$all" = 1 ] || exit 0

step "benchmark smoke run (scripts/bench.sh --quick: every section runs and prints figures; no figure is judged)"
BENCH_PIN=0 BENCH_COLDSTART_REPORT="$E2E_REPORT" DATABASE_URL="$TEST_DATABASE_URL" \
  bash scripts/bench.sh --quick -against HEAD >/dev/null

if [ "${SKIP_PG18:-0}" != 1 ]; then
  # The packages whose tests use a database: those that depend, directly or
  # not, on internal/pgtest. Without -race: the pass above had it, and this
  # one is about the server's behaviour; it keeps the added time down.
  pg_pkgs=$(go list -test -f '{{if .ForTest}}{{.ForTest}} {{join .Deps " "}}{{end}}' ./... \
    | awk '/ github.com\/stripe-inbox\/inbox\/internal\/pgtest( |$)/ {print $1}' | sort -u)
  step "the database suites again on PostgreSQL 18 (SKIP_PG18=1 skips):" $pg_pkgs
  bash scripts/lib/postgres18.sh go test -count=1 -timeout 30m $pg_pkgs
fi

step "build the Lambda bundles (linux/arm64), synthesize the dev and prod stacks offline, check the cost table"
bash scripts/build.sh
# Synthesizes prod and dev (infra/cdk.out is dev's, as before) and fails
# unless docs/deployment.md's cost table is the templates' (scripts/cost).
bash scripts/cost.sh -check

step "fault injection (short): worker kills, database crash, network faults, overload, both paths (webhook and EventBridge)"
bash scripts/chaos.sh --short
