#!/usr/bin/env bash
# Benchmarks (about 5 minutes on 2 cores): the receipt path, the drain
# (per-row and batched), scale with a large history, the purge, cold starts,
# and the claim with 100k receipts waiting for review, each against a limit
# or a baseline measured in the same run (pgbench running the same SQL, the
# same claim without needs-review rows). Prints a markdown table and writes
# it to bench-results/.
#
#   scripts/bench.sh            full run
#   scripts/bench.sh --quick    small sizes, every section (a smoke run, under
#       a minute: scripts/test.sh runs it). It fails when a section does not
#       run to its end or prints no figures; it never judges a figure. Cold
#       starts come from BENCH_COLDSTART_REPORT (the e2e suite's E2E_REPORT,
#       which scripts/test.sh writes) instead of a run of the e2e suite.
#   scripts/bench.sh -only latency,coverage   some sections (receipts, drain,
#       rtt, scale, purge, cold, needsreview, latency, coverage, against,
#       ingest);
#       cold starts are measured only when cold is among them
#   scripts/bench.sh -against b5cb437   also drains the same invoice-only
#       workload with cmd/local's worker built from that commit (git archive
#       into a temporary directory), alternating with this tree's, and
#       reports the ratio (section against; -only against runs just that)
#
# rtt (about 6 minutes a CPU mode) runs the drain (per-row, batches without
# the pipeline, the pipeline; 1, 4 and 8 drainers) and the receipt path through
# toxiproxy with 0 and 1 ms of latency each way (installed into .tmp/bin).
#
# Pinning (BENCH_PIN=1, the default, on a machine with 2 cores or more):
# receipts, drain and rtt run twice, with PostgreSQL's processes on CPU 0 and
# the benchmark (with its pgbench and toxiproxy) on CPU 1, and with every
# process on both. Moving a server's processes is only done to a server the
# benchmark owns: with pinning on and no DATABASE_URL, it starts a throwaway
# cluster (default, durable settings) instead of using 127.0.0.1:5432.
# BENCH_PIN=0 turns pinning off.
#
# latency (about 9 minutes) streams 50 and 500 events/s for 60s each through
# cmd/local's webhook and reports receipt-to-effect p50/p99/max with the
# worker resident and with one scheduled run a minute; coverage (about 3
# minutes) runs back-to-back resident invocations on the schedule scaled
# down 20x and reports the share of time with a live poller.
#
# ingest (about 1 minute) posts events to one cmd/local process by both of
# its routes, signed to the webhook and in EventBridge's envelope to
# /_eventbridge (issue 26), in alternating rounds at the same concurrency,
# and reports the EventBridge/webhook ratio.
#
# PostgreSQL: DATABASE_URL's server, else (pinning on) a throwaway cluster
# with default (durable) settings, else the one on 127.0.0.1:5432, else a
# throwaway cluster. A database named
# inbox_bench is created (dropped first) on it.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/postgres.sh
. scripts/lib/postgres.sh

command -v pgbench >/dev/null || { echo "pgbench is required (Debian: postgresql-contrib / postgresql-client)" >&2; exit 1; }

only=""
against=""
quick=0
prev=""
args=()
for a in "$@"; do
  case $a in
    -only=* | --only=*) only=${a#*=} ;;
    -quick | --quick) quick=1 ;;
  esac
  case $prev in
    -only | --only) only=$a ;;
  esac
  # -against is the script's (the bench gets the binary it builds).
  case $a in
    -against=* | --against=*) against=${a#*=} ;;
    -against | --against) ;;
    *) if [ "$prev" = -against ] || [ "$prev" = --against ]; then against=$a; else args+=("$a"); fi ;;
  esac
  prev=$a
done
has_section() { [ -z "$only" ] || [[ ",$only," == *,$1,* ]]; }

pin=0
if [ "${BENCH_PIN:-1}" != 0 ] && [ "$(nproc)" -ge 2 ] && command -v taskset >/dev/null \
  && { has_section receipts || has_section drain || has_section rtt; }; then
  pin=1
fi

server=${DATABASE_URL:-}
if [ -n "$server" ]; then
  pin=0 # not ours to move
fi
bench_db=""
against_dir=""
cleanup() {
  if [ -n "${TOXIPROXY_PID:-}" ]; then toxiproxy_stop; fi
  if [ -n "$bench_db" ]; then psql "$server" -Xqc "DROP DATABASE IF EXISTS $bench_db WITH (FORCE)" >/dev/null 2>&1 || true; fi
  if [ -n "$against_dir" ]; then rm -rf "$against_dir"; fi
  pg_stop_throwaway
}
trap cleanup EXIT
trap 'exit 130' INT TERM
if [ -z "$server" ]; then
  if [ "$pin" = 1 ]; then
    pg_start_throwaway max_connections=300
    server=$PG_THROWAWAY_URL
  elif pg__answers "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"; then
    server="postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
  else
    pg_start_throwaway max_connections=300
    server=$PG_THROWAWAY_URL
  fi
fi
# A database of this run's own (the server may be shared with other runs),
# dropped at the end whatever happens.
bench_db=inbox_bench_$$
psql "$server" -Xqc "DROP DATABASE IF EXISTS $bench_db WITH (FORCE)" -c "CREATE DATABASE $bench_db" >/dev/null
bench_url=$(printf '%s' "$server" | sed -E "s#/[^/?]*(\\?|\$)#/$bench_db\\1#")

mkdir -p .tmp bench-results
go build -o .tmp/bench ./scripts/bench
go build -o .tmp/local ./cmd/local

extra=()
if [ -n "$against" ]; then
  # The other commit's tree, without touching this one's worktree or index:
  # git archive into a temporary directory, built with the same toolchain.
  rev=$(git rev-parse --short "$against^{commit}")
  against_dir=$(mktemp -d "${TMPDIR:-/tmp}/bench-against-$rev.XXXXXX")
  git archive "$rev" | tar -x -C "$against_dir"
  echo "building cmd/local at $rev..." >&2
  (cd "$against_dir" && go build -o "$OLDPWD/.tmp/local-$rev" ./cmd/local)
  extra+=(-against-local ".tmp/local-$rev" -against-rev "$rev" -against-head "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!bench-results' || echo +changes)")
fi

if [ -n "$only" ] && [[ ",$only," != *,cold,* ]]; then
  BENCH_COLDSTART=0
fi

coldstart=""
if [ "$quick" = 1 ]; then
  BENCH_COLDSTART=0
  coldstart=${BENCH_COLDSTART_REPORT:-}
fi
if [ -d e2e ] && [ "${BENCH_COLDSTART:-1}" = 1 ]; then
  echo "measuring cold starts under the Lambda runtime emulator (e2e suite)..." >&2
  report="$PWD/.tmp/coldstart.md"
  rm -f "$report"
  if TEST_DATABASE_URL="$server" E2E_REPORT="$report" go test -count=1 ./e2e/ >/dev/null 2>&1 && [ -f "$report" ]; then
    coldstart=$report
  fi
fi

if [ "$pin" = 1 ]; then extra+=(-pin); fi
if has_section rtt; then
  # shellcheck source=lib/toxiproxy.sh
  . scripts/lib/toxiproxy.sh
  toxiproxy_install "$PWD/.tmp/bin"
  toxiproxy_start "$PWD/.tmp/bin" "$PWD/.tmp/toxiproxy-bench.log"
  upstream=$(printf '%s' "$server" | sed -E 's#^[a-z]+://([^@/]*@)?([^/?]*).*#\2#')
  case $upstream in *:*) ;; *) upstream="$upstream:5432" ;; esac
  port=$(toxiproxy_add_proxy pg "$upstream")
  extra+=(-toxiproxy "$TOXIPROXY_API" -toxiproxy-proxy pg -toxiproxy-port "$port" -toxiproxy-pid "$TOXIPROXY_PID")
fi

out="bench-results/$(date -u +%Y-%m-%d)-$(uname -m)${only:+-${only//,/-}}.md"
if [ "$quick" = 1 ]; then
  out=.tmp/bench-quick.md # a smoke run's figures are not results
fi
.tmp/bench -db "$bench_url" -coldstart "$coldstart" -local .tmp/local "${extra[@]}" "${args[@]}" | tee "$out"
echo "written to $out" >&2
