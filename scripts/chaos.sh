#!/usr/bin/env bash
# The fault-injection suite (issue 8): nothing lost, nothing doubled.
#
#   scripts/chaos.sh            # full run (about 5-6 minutes on 2 cores)
#   scripts/chaos.sh --short    # the short run scripts/test.sh calls (about 1.5-2.5 minutes)
#   CHAOS_SCENARIOS="workers overload" scripts/chaos.sh --short   # a subset
#
# Real processes, a real PostgreSQL: the script starts its own throwaway
# cluster (fsync on: durability is what is tested), builds cmd/local and
# scripts/stripesim into .tmp/chaos, and runs the webhook and the workers as
# separate cmd/local processes. Each scenario gets a fresh database, which the
# runner migrates. scripts/stripesim plays Stripe (shuffled, duplicated,
# concurrent, retrying every non-2xx with backoff) and then checks the
# database; it prints one figures line per scenario:
#
#   scenario=<name> sent=.. ok2xx=.. retries=.. faults=.. lost=.. doubled=.. unprocessed=.. needs_review=.. ...
#
# sent/ok2xx: deliveries and those answered 2xx; retries: redeliveries after a
# 5xx or transport error; faults: kills, crashes or toxic windows injected;
# lost: expected effects missing; doubled: ledger or outbox rows beyond the
# expected; unprocessed/needs_review: receipts left with processed_at NULL
# (at the attempt limit); receipt_lost: 2xx'd events without a receipt row;
# ambiguous: deliveries that failed although their receipt had committed, and
# whose retry was answered "duplicate"; reattempted: receipts processed on a
# second or later attempt (a kill or fault interrupted the first).
# relay_rows/relay_unpublished/relay_lost/relay_duplicates: the workers
# relay the outbox to an EventBridge stand-in (scripts/ebstandin); every
# outbox row of the run must end marked published (relay_unpublished=0) and
# accepted by the stand-in at least once (relay_lost=0); duplicates, from
# kills between PutEvents and the mark, are allowed and counted.
# writeback_*: in workers and dbcrash the workers also run the sample
# write-back (WRITEBACKS=customer_metadata) against a Stripe API stand-in
# (scripts/stripeapistandin: Stripe's idempotency semantics, some 429s,
# 5xx and requests run and then failed); every payment of the run must
# have one intent, recorded as sent, and one request the stand-in ran
# under its key (writeback_missing = writeback_unsent = writeback_doubled
# = writeback_wrong = 0); replays of a key (writeback_replayed, from
# retries and kills between the call and the record) are counted.
#
# Scenarios:
#   workers   worker processes SIGKILLed at random moments during a drain and restarted
#   dbcrash   PostgreSQL stopped with pg_ctl stop -m immediate and restarted mid-traffic
#   network   toxiproxy between the functions and PostgreSQL: latency, resets
#             (including of commit replies), timeouts and a black hole, toggled
#   overload  128 concurrent deliveries against a webhook pool of DB_MAX_CONNS=2
#   eventbridge  half of the events by EventBridge (POST /_eventbridge), half
#             signed, duplicates across both paths (some concurrent), under
#             the network scenario's toxic windows and worker SIGKILLs
#
#   scripts/chaos.sh eventbridge    # one scenario (full size); also
#   scripts/chaos.sh --short eventbridge
#
# Exits non-zero if any scenario's check fails. Every wait is bounded, and
# every process it started is stopped on exit, including on failure.
# Logs: .tmp/chaos/logs/ (kept for investigation; removed at the next run).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
# shellcheck source=lib/postgres.sh
. scripts/lib/postgres.sh
# shellcheck source=lib/toxiproxy.sh
. scripts/lib/toxiproxy.sh

MODE=full
case "${1:-}" in
  --short) MODE=short; shift ;;
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
esac
ALL_SCENARIOS="workers dbcrash network overload eventbridge"
SCENARIOS=${CHAOS_SCENARIOS:-$ALL_SCENARIOS}
if [ $# -gt 0 ]; then
  case "$1" in
    -*) echo "usage: $0 [--short] [SCENARIO...] ($ALL_SCENARIOS)" >&2; exit 2 ;;
  esac
  SCENARIOS="$*"
fi
for s in $SCENARIOS; do # before anything starts
  case " $ALL_SCENARIOS " in
    *" $s "*) ;;
    *) echo "$0: unknown scenario $s ($ALL_SCENARIOS)" >&2; exit 2 ;;
  esac
done
# The functions read their settings from the environment: clear what a
# developer's shell may hold, so that only what this script sets applies.
unset DATABASE_URL SIGNING_SECRET_ARNS DB_PROXY_HOST DB_PROXY_PORT DB_NAME DB_USER DB_MAX_CONNS \
  STORE_TIMEOUT MAX_BODY_BYTES SECRET_TTL METRICS_NAMESPACE METRICS_DIMENSIONS WORKER_CONCURRENCY \
  BATCH_SIZE CLAIM_LIMIT LEASE STATEMENT_TIMEOUT DEADLINE_MARGIN BACKOFF_BASE BACKOFF_CAP MAX_ATTEMPTS \
  LOCAL_COMPONENTS LISTEN_ADDR WEBHOOK_ENDPOINT WORKER_INTERVAL WORKER_TIMEOUT LOG_LEVEL \
  POLL_INTERVAL LISTEN NOTIFY \
  OUTBOX_BUS OUTBOX_SOURCE OUTBOX_MAX_ATTEMPTS OUTBOX_CLAIM_LIMIT OUTBOX_LEASE OUTBOX_CALL_TIMEOUT \
  OUTBOX_BACKOFF_BASE OUTBOX_BACKOFF_CAP OUTBOX_EVERY AWS_ENDPOINT_URL_EVENTBRIDGE AWS_PROFILE \
  WRITEBACKS STRIPE_API_KEY STRIPE_API_BASE WRITEBACK_INTERVAL WRITEBACK_CLAIM_LIMIT WRITEBACK_LEASE \
  WRITEBACK_CALL_TIMEOUT WRITEBACK_MAX_ATTEMPTS WRITEBACK_BACKOFF_BASE WRITEBACK_BACKOFF_CAP

if [ "$MODE" = short ]; then
  WORKERS_INVOICES=1500 WORKERS_KILLS=12 WORKERS_MIN_KILLS=8
  CRASH_INVOICES=250 CRASH_RATE=120 CRASHES=2
  NET_INVOICES=250 NET_RATE=80 NET_FAULTS=12
  OVERLOAD_INVOICES=400
  EB_INVOICES=250 EB_RATE=80 EB_FAULTS=12
else
  WORKERS_INVOICES=6000 WORKERS_KILLS=45 WORKERS_MIN_KILLS=30
  CRASH_INVOICES=800 CRASH_RATE=120 CRASHES=5
  NET_INVOICES=1200 NET_RATE=80 NET_FAULTS=60
  OVERLOAD_INVOICES=1500
  EB_INVOICES=1000 EB_RATE=80 EB_FAULTS=50
fi

OUT=$ROOT/.tmp/chaos
LOGS=$OUT/logs
rm -rf "$LOGS"
mkdir -p "$LOGS"
log() { echo "[chaos] $(date +%H:%M:%S) $*" >&2; }
die() { log "FAILED: $*"; exit 1; }

# ---------------------------------------------------------------------------
# Processes: every child is recorded in PIDS and stopped by cleanup.
declare -A PIDS=()

stop_pid() { # PID: SIGTERM, then SIGKILL after 10s
  local pid=$1 i
  kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

stop_all() {
  local name
  for name in "${!PIDS[@]}"; do
    stop_pid "${PIDS[$name]}"
    unset "PIDS[$name]"
  done
}

cleanup() {
  local rc=$?
  trap - EXIT
  stop_all
  if [ -n "${EB_PID:-}" ]; then stop_pid "$EB_PID"; fi
  if [ -n "${API_PID:-}" ]; then stop_pid "$API_PID"; fi
  toxiproxy_stop
  pg_stop_throwaway
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# slow_link NAME DB LATENCY_MS: a toxiproxy link to PostgreSQL that delays
# every reply (server to client) by LATENCY_MS, so that no round trip through
# it can take less, on any machine. Starts toxiproxy if this scenario has not
# yet. Sets SLOW_URL to DB's URL through the link.
slow_link() {
  local name=$1 db=$2 ms=$3 port
  if [ -z "$TOXIPROXY_PID" ]; then
    toxiproxy_install "$OUT/bin" || die "cannot install toxiproxy"
    toxiproxy_start "$OUT/bin" "$SLOGS/toxiproxy.log" || die "cannot start toxiproxy"
  fi
  port=$(toxiproxy_add_proxy "$name" "127.0.0.1:$PG_THROWAWAY_PORT") || die "cannot create the proxy $name"
  toxiproxy_add_toxic "$name" "${name}_latency" latency downstream 1.0 "{\"latency\":$ms,\"jitter\":0}" \
    || die "cannot add latency to $name"
  SLOW_URL="postgres://postgres@127.0.0.1:$port/$db?sslmode=disable&connect_timeout=5"
}

rand_ms() { echo $((RANDOM % ($2 - $1 + 1) + $1)); } # LO HI
sleep_ms() { sleep "$(printf '%d.%03d' $(($1 / 1000)) $(($1 % 1000)))"; }

# ---------------------------------------------------------------------------
# PostgreSQL: fsync and synchronous commit on; the same settings again after
# each crash.
PG_SETTINGS=(fsync=on synchronous_commit=on full_page_writes=on)
pg_start_throwaway "${PG_SETTINGS[@]}" || die "cannot start PostgreSQL"
PSQL="$PG_BINDIR/psql"
[ -x "$PSQL" ] || PSQL=psql

pg_crash() {
  pg__as_owner "$PG_BINDIR/pg_ctl" -D "$PG_THROWAWAY_DIR/data" -m immediate stop >/dev/null
}
pg_restart() {
  local opts="-p $PG_THROWAWAY_PORT -k $PG_THROWAWAY_DIR -c listen_addresses=127.0.0.1 -c max_connections=300" o
  for o in "${PG_SETTINGS[@]}"; do opts="$opts -c $o"; done
  pg__as_owner "$PG_BINDIR/pg_ctl" -D "$PG_THROWAWAY_DIR/data" -l "$PG_THROWAWAY_DIR/server.log" -o "$opts" -w -t 60 start >/dev/null
}

db_url() { echo "postgres://postgres@127.0.0.1:$PG_THROWAWAY_PORT/$1?sslmode=disable"; }
new_db() {
  "$PSQL" "$PG_THROWAWAY_URL" -XAtq -v ON_ERROR_STOP=1 -c "CREATE DATABASE $1" >/dev/null
}
backlog() { # DBURL: unprocessed receipts (empty when the database does not answer)
  PGCONNECT_TIMEOUT=3 "$PSQL" "$1" -XAtqc "SELECT count(*) FROM webhook_inbox WHERE processed_at IS NULL" 2>/dev/null || true
}

# ---------------------------------------------------------------------------
log "building cmd/local and scripts/stripesim into .tmp/chaos"
go build -o "$OUT/local" ./cmd/local
go build -o "$OUT/stripesim" ./scripts/stripesim
go build -o "$OUT/ebstandin" ./scripts/ebstandin
go build -o "$OUT/stripeapistandin" ./scripts/stripeapistandin

# The EventBridge stand-in the workers' outbox relay publishes to (issue 17),
# one for the whole run (stopped by cleanup, not by a scenario's stop_all);
# stripesim -eventbridge checks at the end of each scenario that every
# outbox row of its run is marked published and was accepted at least once.
EB_BUS=chaos-outbox
"$OUT/ebstandin" "$EB_BUS" >"$LOGS/ebstandin.log" 2>&1 &
EB_PID=$!
EB_URL=
for i in $(seq 1 600); do # a bound against a hang (60 s), not a speed requirement
  EB_URL=$(sed -n 's|^listening on \(http://[^ ]*\)$|\1|p' "$LOGS/ebstandin.log" 2>/dev/null | head -1)
  [ -n "$EB_URL" ] && break
  kill -0 "$EB_PID" 2>/dev/null || break
  sleep 0.1
done
[ -n "$EB_URL" ] || die "the EventBridge stand-in did not start"

# The Stripe API stand-in the workers' write-back sender calls (issue 28),
# one for the whole run like the EventBridge one (the run's idempotency
# keys carry its prefix). It answers about 3% of requests 429, 4% 500/503
# without running them, and runs 6% and then fails the answer (a 500 or a
# closed connection).
"$OUT/stripeapistandin" >"$LOGS/stripeapistandin.log" 2>&1 &
API_PID=$!
API_URL=
for i in $(seq 1 600); do # a bound against a hang (60 s), not a speed requirement
  API_URL=$(sed -n 's|^listening on \(http://[^ ]*\).*$|\1|p' "$LOGS/stripeapistandin.log" 2>/dev/null | head -1)
  [ -n "$API_URL" ] && break
  kill -0 "$API_PID" 2>/dev/null || break
  sleep 0.1
done
[ -n "$API_URL" ] || die "the Stripe API stand-in did not start"

SECRET="whsec_chaos_$RANDOM$RANDOM$RANDOM"
export STRIPE_WEBHOOK_SECRET=$SECRET

# Worker settings: a short interval and lease so that a killed worker's
# claims come back in seconds. LEASE >= CLAIM_LIMIT x STATEMENT_TIMEOUT
# (3s >= 5 x 500ms), DEADLINE_MARGIN > STATEMENT_TIMEOUT, WORKER_TIMEOUT >
# DEADLINE_MARGIN. MAX_ATTEMPTS is high so that kills and faults, which each
# use up an attempt of the receipts in flight, do not push rows to review.
# POLL_INTERVAL=0: scheduled-only workers, each run returning when the inbox
# is empty; RESIDENT_ENV overrides that for resident workers (issue 14):
# runs every second that stay 1.5s (WORKER_TIMEOUT - DEADLINE_MARGIN, so
# consecutive runs overlap), polling every 100ms and woken by the webhook's
# NOTIFY through LISTEN.
MAX_ATTEMPTS=50
WORKER_ENV=(
  LOCAL_COMPONENTS=worker WORKER_INTERVAL=200ms WORKER_TIMEOUT=10s POLL_INTERVAL=0
  WORKER_CONCURRENCY=2 DB_MAX_CONNS=3 CLAIM_LIMIT=5 STATEMENT_TIMEOUT=500ms
  LEASE=3s DEADLINE_MARGIN=2s MAX_ATTEMPTS=$MAX_ATTEMPTS BACKOFF_BASE=50ms BACKOFF_CAP=1s
  LOG_LEVEL=warn
  # The outbox relay, inside each worker, to the stand-in: a short lease so
  # that a killed worker's claimed rows come back in seconds; attempts
  # enough that kills never park a row.
  OUTBOX_BUS=$EB_BUS AWS_ENDPOINT_URL_EVENTBRIDGE=$EB_URL AWS_REGION=us-east-1
  AWS_ACCESS_KEY_ID=AKIDCHAOS AWS_SECRET_ACCESS_KEY=chaos-secret
  OUTBOX_CLAIM_LIMIT=20 OUTBOX_CALL_TIMEOUT=1s OUTBOX_LEASE=3s OUTBOX_MAX_ATTEMPTS=1000
  OUTBOX_BACKOFF_BASE=50ms OUTBOX_BACKOFF_CAP=1s OUTBOX_EVERY=200ms
)
# The sample write-back (WRITEBACKS_ENV, in workers and dbcrash) to the
# Stripe API stand-in: the sender runs every 200ms in each worker; a short
# lease (3s > the 1s call timeout) so that a killed worker's claimed
# intents come back in seconds, a short backoff, and attempts enough that
# faults and kills never park an intent.
WRITEBACKS_ENV=(
  WRITEBACKS=customer_metadata STRIPE_API_KEY=sk_test_stand_in STRIPE_API_BASE=$API_URL
  WRITEBACK_INTERVAL=200ms WRITEBACK_CLAIM_LIMIT=5 WRITEBACK_LEASE=3s WRITEBACK_CALL_TIMEOUT=1s
  WRITEBACK_MAX_ATTEMPTS=100 WRITEBACK_BACKOFF_BASE=50ms WRITEBACK_BACKOFF_CAP=1s
)
RESIDENT_ENV=(POLL_INTERVAL=100ms LISTEN=on WORKER_INTERVAL=1s WORKER_TIMEOUT=3500ms)

# start_webhook NAME DBURL [VAR=value...]: starts a webhook process and waits
# (bounded) for its "listening" line; sets WEBHOOK_URL.
start_webhook() {
  local name=$1 url=$2 i addr
  shift 2
  # Port 0: the kernel picks a free port, and the runner prints the address
  # it got ("listening on http://127.0.0.1:PORT/billing ..."): no race with
  # another process between choosing a port and binding it.
  env DATABASE_URL="$url" LOCAL_COMPONENTS=webhook LISTEN_ADDR="127.0.0.1:0" \
    WEBHOOK_ENDPOINT=billing LOG_LEVEL=warn "$@" \
    "$OUT/local" >"$SLOGS/$name.log" 2>&1 &
  PIDS[$name]=$!
  for i in $(seq 1 300); do
    addr=$(sed -n 's|^listening on \(http://[^ ]*\) .*|\1|p' "$SLOGS/$name.log" 2>/dev/null | head -1)
    if [ -n "$addr" ]; then WEBHOOK_URL=$addr; return 0; fi
    kill -0 "${PIDS[$name]}" 2>/dev/null || break
    sleep 0.1
  done
  cat "$SLOGS/$name.log" >&2
  die "$name did not start"
}

# start_worker NAME DBURL [VAR=value...]: starts (or restarts) a worker
# process; its log is appended to.
start_worker() {
  local name=$1 url=$2
  shift 2
  env DATABASE_URL="$url" STRIPE_MODE=test "${WORKER_ENV[@]}" "$@" "$OUT/local" >>"$SLOGS/$name.log" 2>&1 &
  PIDS[$name]=$!
}

# wait_worker_ready NAME: waits (bounded) until the worker has printed its
# start line.
wait_worker_ready() {
  local i
  for i in $(seq 1 300); do
    grep -q "worker running" "$SLOGS/$1.log" 2>/dev/null && return 0
    kill -0 "${PIDS[$1]}" 2>/dev/null || break
    sleep 0.1
  done
  cat "$SLOGS/$1.log" >&2
  die "$1 did not start"
}

# sim SCENARIO [flags...]: runs stripesim in the foreground; sim_bg runs it
# in the background (SIM_PID). The figures line goes to LOGS/SCENARIO.figures,
# the rest of its output to LOGS/SCENARIO.sim.log; the functions' logs are in
# LOGS/SCENARIO/.
FIGURES=()
FAILED=()
sim() {
  local scenario=$1
  shift
  "$OUT/stripesim" -scenario "$scenario" -max-attempts "$MAX_ATTEMPTS" -eventbridge "$EB_URL" "$@" \
    >"$LOGS/$scenario.figures" 2>>"$LOGS/$scenario.sim.log"
}
sim_bg() {
  local scenario=$1
  shift
  "$OUT/stripesim" -scenario "$scenario" -max-attempts "$MAX_ATTEMPTS" -eventbridge "$EB_URL" "$@" \
    >"$LOGS/$scenario.figures" 2>>"$LOGS/$scenario.sim.log" &
  SIM_PID=$!
  PIDS[sim]=$SIM_PID
}
record() { # SCENARIO RC
  local line
  sed 's/^/  /' "$LOGS/$1.sim.log" >&2
  line=$(grep '^scenario=' "$LOGS/$1.figures" 2>/dev/null || echo "scenario=$1 (no figures: stripesim failed, see $LOGS/$1.sim.log)")
  echo "$line"
  FIGURES+=("$line")
  [ "$2" = 0 ] || FAILED+=("$1")
}

# ---------------------------------------------------------------------------
# 1. Worker crashes: a backlog of several thousand receipts is drained by three
# worker processes (one drainer each) while they are SIGKILLed at random
# moments and restarted. Fails if the backlog drained before
# WORKERS_MIN_KILLS kills: the run proved nothing.
#
# Why the kills land during the drain on any machine: the workers reach
# PostgreSQL through a link that delays every reply by WORKERS_LATENCY_MS.
# A claim of at most CLAIM_LIMIT=5 receipts and the transaction that applies
# them take at least three round trips (claim, lock, commit), so three
# workers drain at most 3 x 5 / (3 x 15ms) = 333 receipts/s however fast
# the machine: the short run's ~5,800 receipts take at least 17s, while its
# 12 kills, one every 0.1-0.4s, take a few seconds. A slower machine only
# drains more slowly. (Without the latency a faster machine emptied the
# backlog before enough kills.)
#
# Workers 1 and 2 are resident (RESIDENT_ENV: a kill may land while they
# drain, poll or listen, and their runs overlap); worker 3 is scheduled-only.
WORKERS_LATENCY_MS=15
worker_mode() { # NAME: the extra settings of that worker
  case $1 in
    worker3) ;;
    *) echo "${RESIDENT_ENV[@]}" ;;
  esac
  echo "${WRITEBACKS_ENV[@]}"
}
scenario_workers() {
  local db=chaos_workers url rc=0 kills=0 n victim started
  new_db $db
  url=$(db_url $db)
  start_webhook webhook "$url" DB_MAX_CONNS=10
  log "workers: delivering $WORKERS_INVOICES invoices' events with no worker running"
  sim workers -phase send -state "$LOGS/workers.state" -url "$WEBHOOK_URL" \
    -invoices "$WORKERS_INVOICES" -concurrency 16 || rc=$?
  slow_link pg_workers $db "$WORKERS_LATENCY_MS"
  log "workers: backlog $(backlog "$url"); starting 3 workers (${WORKERS_LATENCY_MS}ms per reply; 1 and 2 resident), killing one every 0.1-0.4s"
  # shellcheck disable=SC2046 # worker_mode's words are separate settings
  for n in 1 2 3; do start_worker "worker$n" "$SLOW_URL" WORKER_CONCURRENCY=1 DB_MAX_CONNS=2 $(worker_mode "worker$n"); done
  started=$SECONDS
  while [ "$kills" -lt "$WORKERS_KILLS" ] && [ $((SECONDS - started)) -lt 240 ]; do
    sleep_ms "$(rand_ms 100 400)"
    [ "$(backlog "$url")" = 0 ] && break
    victim="worker$((RANDOM % 3 + 1))"
    kill -KILL "${PIDS[$victim]}" 2>/dev/null || true
    wait "${PIDS[$victim]}" 2>/dev/null || true
    kills=$((kills + 1))
    # shellcheck disable=SC2046
    start_worker "$victim" "$SLOW_URL" WORKER_CONCURRENCY=1 DB_MAX_CONNS=2 $(worker_mode "$victim")
  done
  log "workers: $kills kills; backlog $(backlog "$url") when the killing stopped"
  sim workers -phase check -state "$LOGS/workers.state" -db "$url" -faults "$kills" -drain-timeout 120s \
    -stripe-api "$API_URL" || rc=$?
  if [ "$kills" -lt "$WORKERS_MIN_KILLS" ]; then
    log "workers: only $kills kills before the backlog drained (at least $WORKERS_MIN_KILLS wanted)"
    rc=1
  fi
  record workers "$rc"
  stop_all
  toxiproxy_stop
}

# 2. Database crash: PostgreSQL is stopped with -m immediate and restarted
# while deliveries and drains are in flight.
scenario_dbcrash() {
  local db=chaos_dbcrash url rc=0 crashes=0 n
  new_db $db
  url=$(db_url $db)
  start_webhook webhook "$url" DB_MAX_CONNS=10
  for n in 1 2; do start_worker "worker$n" "$url" "${WRITEBACKS_ENV[@]}"; wait_worker_ready "worker$n"; done
  log "dbcrash: delivering $CRASH_INVOICES invoices' events at $CRASH_RATE/s; up to $CRASHES crashes"
  sim_bg dbcrash -phase send -state "$LOGS/dbcrash.state" -url "$WEBHOOK_URL" \
    -invoices "$CRASH_INVOICES" -rate "$CRASH_RATE" -concurrency 16
  while [ "$crashes" -lt "$CRASHES" ]; do
    sleep_ms "$(rand_ms 1500 3500)"
    kill -0 "$SIM_PID" 2>/dev/null || break
    log "dbcrash: pg_ctl stop -m immediate"
    pg_crash || die "dbcrash: pg_ctl stop -m immediate failed"
    crashes=$((crashes + 1))
    sleep_ms "$(rand_ms 500 2000)"
    pg_restart || { tail -20 "$PG_THROWAWAY_DIR/server.log" >&2; die "dbcrash: PostgreSQL did not restart"; }
    log "dbcrash: PostgreSQL is back (crash recovery done)"
  done
  wait "$SIM_PID" || rc=$?
  unset "PIDS[sim]"
  [ "$crashes" -ge 1 ] || log "dbcrash: WARNING: delivery ended before the first crash"
  sim dbcrash -phase check -state "$LOGS/dbcrash.state" -db "$url" -faults "$crashes" -drain-timeout 120s \
    -stripe-api "$API_URL" || rc=$?
  record dbcrash "$rc"
  stop_all
}

# 3. Network faults between the functions and PostgreSQL, through toxiproxy.
# The functions reach PostgreSQL only through the proxy; stripesim's check
# connects directly. Toxic windows follow one another, each on for 0.6-1.5s,
# for as long as the delivery lasts (at most NET_FAULTS windows).
NET_TOXICS=(
  # name type stream toxicity attributes                                what it does
  "latency latency downstream 1.0 {\"latency\":150,\"jitter\":100}" # slow replies
  "resetreply reset_peer downstream 0.5 {\"timeout\":0}"              # RST instead of the reply: commits become ambiguous
  "resetlate reset_peer downstream 0.3 {\"timeout\":30}"              # RST 30ms after the reply starts
  "resetsend reset_peer upstream 0.3 {\"timeout\":0}"                 # RST when the client sends
  "timeout timeout downstream 0.5 {\"timeout\":1000}"                 # replies dropped, closed after 1s
  "blackhole timeout upstream 1.0 {\"timeout\":0}"                    # nothing gets through until removed
)
scenario_network() {
  local db=chaos_network url proxied tport rc=0 faults=0 n spec name type stream tox attrs
  toxiproxy_install "$OUT/bin" || die "network: cannot install toxiproxy"
  toxiproxy_start "$OUT/bin" "$SLOGS/toxiproxy.log" || die "network: cannot start toxiproxy"
  tport=$(toxiproxy_add_proxy pg "127.0.0.1:$PG_THROWAWAY_PORT") || die "network: cannot create the proxy"
  new_db $db
  url=$(db_url $db)
  proxied="postgres://postgres@127.0.0.1:$tport/$db?sslmode=disable&connect_timeout=3"
  start_webhook webhook "$proxied" DB_MAX_CONNS=10 STORE_TIMEOUT=2s
  for n in 1 2; do start_worker "worker$n" "$proxied"; wait_worker_ready "worker$n"; done
  log "network: delivering $NET_INVOICES invoices' events at $NET_RATE/s; up to $NET_FAULTS toxic windows"
  sim_bg network -phase send -state "$LOGS/network.state" -url "$WEBHOOK_URL" \
    -invoices "$NET_INVOICES" -rate "$NET_RATE" -concurrency 16
  while [ "$faults" -lt "$NET_FAULTS" ]; do
    sleep_ms "$(rand_ms 200 600)"
    kill -0 "$SIM_PID" 2>/dev/null || break
    spec=${NET_TOXICS[$((faults % ${#NET_TOXICS[@]}))]}
    read -r name type stream tox attrs <<<"$spec"
    toxiproxy_add_toxic pg "$name" "$type" "$stream" "$tox" "$attrs" || die "network: cannot add toxic $name"
    faults=$((faults + 1))
    sleep_ms "$(rand_ms 600 1500)"
    toxiproxy_remove_toxic pg "$name" || die "network: cannot remove toxic $name"
  done
  wait "$SIM_PID" || rc=$?
  unset "PIDS[sim]"
  toxiproxy_reset || true
  log "network: $faults toxic windows injected; checking"
  sim network -phase check -state "$LOGS/network.state" -db "$url" -faults "$faults" -drain-timeout 150s || rc=$?
  record network "$rc"
  stop_all
  toxiproxy_stop
}

# 4. Overload: 128 concurrent deliveries against a webhook with a pool of two
# connections, a short store timeout (200ms, so that waiting for the pool
# ends in a refusal) and a link to PostgreSQL that delays every reply by
# OVERLOAD_LATENCY_MS (10ms). Requests are served or refused with 5xx, never
# half-stored.
#
# Why refusals must happen, on any machine: a store takes at least one round
# trip, so the pool completes at most 2 x 200ms / 10ms = 40 stores within one
# store timeout, however fast the machine, while 128 deliveries wait at once;
# the rest are refused. (Without the latency a fast machine served all 1,657
# deliveries of the short run within their timeouts: nothing was overloaded.)
# A slower machine only refuses more. Stripe retries a refused delivery for
# three days; the simulated sender retries up to 60 times over 5 minutes, so
# a busy machine that refuses more still delivers everything. Fails if
# nothing was refused: then the run proved nothing.
OVERLOAD_LATENCY_MS=10
scenario_overload() {
  local db=chaos_overload url rc=0 n
  new_db $db
  url=$(db_url $db)
  slow_link pg_overload $db "$OVERLOAD_LATENCY_MS"
  start_webhook webhook "$SLOW_URL" DB_MAX_CONNS=2 STORE_TIMEOUT=200ms
  for n in 1 2; do start_worker "worker$n" "$url"; wait_worker_ready "worker$n"; done
  log "overload: $OVERLOAD_INVOICES invoices' events, 128 concurrent deliveries, webhook pool of 2, ${OVERLOAD_LATENCY_MS}ms per reply"
  sim overload -phase all -url "$WEBHOOK_URL" -db "$url" -invoices "$OVERLOAD_INVOICES" \
    -concurrency 128 -max-tries 60 -retry-for 300s -drain-timeout 120s || rc=$?
  if ! grep -q ' non2xx=[^ ]*500:' "$LOGS/overload.figures" 2>/dev/null; then
    log "overload: no delivery was refused; the webhook was not overloaded"
    rc=1
  fi
  record overload "$rc"
  stop_all
  toxiproxy_stop
}

# restart_worker NAME DBURL: starts the worker again and waits (bounded)
# for its new start line; starts it once more if it exited before (its
# first connection met a fault).
restart_worker() {
  local name=$1 url=$2 before try i
  for try in 1 2 3 4 5; do
    before=$(grep -c "worker running" "$SLOGS/$name.log" 2>/dev/null || true)
    start_worker "$name" "$url"
    for i in $(seq 1 300); do
      [ "$(grep -c "worker running" "$SLOGS/$name.log" 2>/dev/null || true)" -gt "${before:-0}" ] && return 0
      kill -0 "${PIDS[$name]}" 2>/dev/null || break
      sleep 0.1
    done
    wait "${PIDS[$name]}" 2>/dev/null || true
  done
  die "$name did not restart"
}

# 5. Both paths (issue 26): about half of the events by EventBridge (POST
# /_eventbridge on the same runner, the envelope EventBridge hands a
# target; the ingest function's handler), the rest signed to the webhook
# route; about 10% delivered twice, three in four of those one copy by each
# path (half of the duplicates as two concurrent requests). The runner and
# the workers reach PostgreSQL through toxiproxy, with the network
# scenario's toxic windows (resets of commit replies make commits
# ambiguous on either path); in about half of the windows a worker is
# SIGKILLed and restarted. The end-state checks are the others': one
# receipt per event whichever path brought it first, or both at once; lost
# = doubled = 0. Fails if no receipt came by EventBridge or no event was
# sent by both paths: then the run proved nothing.
scenario_eventbridge() {
  local db=chaos_eventbridge url proxied tport rc=0 faults=0 kills=0 n spec name type stream tox attrs victim
  toxiproxy_install "$OUT/bin" || die "eventbridge: cannot install toxiproxy"
  toxiproxy_start "$OUT/bin" "$SLOGS/toxiproxy.log" || die "eventbridge: cannot start toxiproxy"
  tport=$(toxiproxy_add_proxy pg_eb "127.0.0.1:$PG_THROWAWAY_PORT") || die "eventbridge: cannot create the proxy"
  new_db $db
  url=$(db_url $db)
  proxied="postgres://postgres@127.0.0.1:$tport/$db?sslmode=disable&connect_timeout=3"
  # WEBHOOK_ENDPOINT=billing (start_webhook): the runner maps every
  # aws.partner/stripe.com/ source to it, so both paths store under one
  # endpoint.
  start_webhook webhook "$proxied" DB_MAX_CONNS=10 STORE_TIMEOUT=2s
  local eb_url=${WEBHOOK_URL%/billing}/_eventbridge
  for n in 1 2; do start_worker "worker$n" "$proxied"; wait_worker_ready "worker$n"; done
  log "eventbridge: delivering $EB_INVOICES invoices' events at $EB_RATE/s, half by $eb_url; up to $EB_FAULTS toxic windows"
  sim_bg eventbridge -phase send -state "$LOGS/eventbridge.state" -url "$WEBHOOK_URL" -eventbridge-url "$eb_url" \
    -invoices "$EB_INVOICES" -rate "$EB_RATE" -concurrency 16
  while [ "$faults" -lt "$EB_FAULTS" ]; do
    sleep_ms "$(rand_ms 200 600)"
    kill -0 "$SIM_PID" 2>/dev/null || break
    spec=${NET_TOXICS[$((faults % ${#NET_TOXICS[@]}))]}
    read -r name type stream tox attrs <<<"$spec"
    toxiproxy_add_toxic pg_eb "$name" "$type" "$stream" "$tox" "$attrs" || die "eventbridge: cannot add toxic $name"
    faults=$((faults + 1))
    victim=
    if [ $((RANDOM % 2)) = 0 ]; then
      victim="worker$((RANDOM % 2 + 1))"
      kill -KILL "${PIDS[$victim]}" 2>/dev/null || true
      wait "${PIDS[$victim]}" 2>/dev/null || true
      kills=$((kills + 1))
    fi
    sleep_ms "$(rand_ms 600 1500)"
    toxiproxy_remove_toxic pg_eb "$name" || die "eventbridge: cannot remove toxic $name"
    # Restarted between windows: a runner that cannot connect at start
    # exits (a configuration mistake fails at start), so a restart into a
    # toxic window would leave no worker.
    [ -z "$victim" ] || restart_worker "$victim" "$proxied"
  done
  wait "$SIM_PID" || rc=$?
  unset "PIDS[sim]"
  toxiproxy_reset || true
  log "eventbridge: $faults toxic windows, $kills worker kills; checking"
  sim eventbridge -phase check -state "$LOGS/eventbridge.state" -db "$url" -faults "$((faults + kills))" -drain-timeout 150s || rc=$?
  if ! grep -q ' receipts_eventbridge=[1-9]' "$LOGS/eventbridge.figures" 2>/dev/null; then
    log "eventbridge: no receipt came by EventBridge"
    rc=1
  fi
  if ! grep -q ' cross_path=[1-9]' "$LOGS/eventbridge.figures" 2>/dev/null; then
    log "eventbridge: no event was sent by both paths"
    rc=1
  fi
  record eventbridge "$rc"
  stop_all
  toxiproxy_stop
}

for s in $SCENARIOS; do
  log "=== $s ($MODE)"
  SLOGS=$LOGS/$s
  mkdir -p "$SLOGS"
  start=$SECONDS
  "scenario_$s"
  log "=== $s took $((SECONDS - start))s"
done

echo "== chaos ($MODE) figures"
printf '%s\n' "${FIGURES[@]}"
if [ ${#FAILED[@]} -gt 0 ]; then
  echo "chaos: FAILED: ${FAILED[*]} (logs in $LOGS)"
  exit 1
fi
echo "chaos: all scenarios passed"
