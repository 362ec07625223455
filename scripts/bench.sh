#!/usr/bin/env bash
# Benchmarks (about 5 minutes on 2 cores): the receipt path, the drain
# (per-row and batched), scale with a large history, the purge, cold starts,
# and the claim with 100k receipts waiting for review, each against a limit
# or a baseline measured in the same run (pgbench running the same SQL, the
# same claim without needs-review rows). Prints a markdown table and writes
# it to bench-results/.
#
#   scripts/bench.sh            full run
#   scripts/bench.sh --quick    small sizes (a smoke run)
#   scripts/bench.sh -only latency,coverage   some sections (receipts, drain,
#       scale, purge, cold, needsreview, latency, coverage); cold starts are
#       measured only when cold is among them
#
# latency (about 9 minutes) streams 50 and 500 events/s for 60s each through
# cmd/local's webhook and reports receipt-to-effect p50/p99/max with the
# worker resident and with one scheduled run a minute; coverage (about 3
# minutes) runs back-to-back resident invocations on the schedule scaled
# down 20x and reports the share of time with a live poller.
#
# PostgreSQL: DATABASE_URL's server, else the one on 127.0.0.1:5432, else a
# throwaway cluster with default (durable) settings. A database named
# inbox_bench is created (dropped first) on it.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/postgres.sh
. scripts/lib/postgres.sh

command -v pgbench >/dev/null || { echo "pgbench is required (Debian: postgresql-contrib / postgresql-client)" >&2; exit 1; }

server=${DATABASE_URL:-}
if [ -z "$server" ]; then
  if pg__answers "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"; then
    server="postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
  else
    trap pg_stop_throwaway EXIT
    pg_start_throwaway max_connections=300
    server=$PG_THROWAWAY_URL
  fi
fi
psql "$server" -Xqc "DROP DATABASE IF EXISTS inbox_bench WITH (FORCE)" -c "CREATE DATABASE inbox_bench" >/dev/null
bench_url=$(printf '%s' "$server" | sed -E 's#/[^/?]*(\?|$)#/inbox_bench\1#')

mkdir -p .tmp bench-results
go build -o .tmp/bench ./scripts/bench
go build -o .tmp/local ./cmd/local

only=""
prev=""
for a in "$@"; do
  case $a in
    -only=* | --only=*) only=${a#*=} ;;
  esac
  case $prev in
    -only | --only) only=$a ;;
  esac
  prev=$a
done
if [ -n "$only" ] && [[ ",$only," != *,cold,* ]]; then
  BENCH_COLDSTART=0
fi

coldstart=""
if [ -d e2e ] && [ "${BENCH_COLDSTART:-1}" = 1 ]; then
  echo "measuring cold starts under the Lambda runtime emulator (e2e suite)..." >&2
  report="$PWD/.tmp/coldstart.md"
  rm -f "$report"
  if TEST_DATABASE_URL="$server" E2E_REPORT="$report" go test -count=1 ./e2e/ >/dev/null 2>&1 && [ -f "$report" ]; then
    coldstart=$report
  fi
fi

out="bench-results/$(date -u +%Y-%m-%d)-$(uname -m)${only:+-${only//,/-}}.md"
.tmp/bench -db "$bench_url" -coldstart "$coldstart" -local .tmp/local "$@" | tee "$out"
psql "$server" -Xqc "DROP DATABASE IF EXISTS inbox_bench WITH (FORCE)" >/dev/null
echo "written to $out" >&2
