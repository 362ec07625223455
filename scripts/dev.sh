#!/usr/bin/env bash
# Runs the system locally: migrations, the webhook on http://LISTEN_ADDR/<endpoint>
# (default http://127.0.0.1:8080/billing) through the same Function URL handler
# as AWS, and the worker every WORKER_INTERVAL (default 2s) in place of the
# schedule. Each worker run stays resident (POLL_INTERVAL, default 250ms)
# and the webhook's NOTIFY wakes it (LISTEN), so effects follow receipts
# within milliseconds, also with WORKER_INTERVAL=60s (the deployed cadence):
# runs overlap by default (WORKER_TIMEOUT). POLL_INTERVAL=0 runs the
# scheduled-only worker. Ctrl-C stops everything it started, including a
# throwaway PostgreSQL.
#
# Environment: DATABASE_URL (else a database "inbox_dev" on the server on
# 127.0.0.1:5432, else on a throwaway cluster), LISTEN_ADDR,
# STRIPE_WEBHOOK_SECRET (default whsec_local_dev; or the one `stripe listen`
# prints), WEBHOOK_ENDPOINT (default billing), STRIPE_MODE (default test: the
# mode the worker books; `stripe listen` and cmd/sendevent send test-mode
# events), and any variable of the worker (README, Configuration).
# OUTBOX_BUS set: the worker also relays the outbox to that EventBridge bus,
# with the AWS SDK's usual configuration, so AWS_ENDPOINT_URL_EVENTBRIDGE,
# AWS_REGION and static credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)
# point it at a stand-in.
#
# Reconciler (issue 15): when STRIPE_API_KEY is set (a restricted key with
# Events: Read, rk_test_...), the runner also lists Stripe's Events API every
# RECONCILE_INTERVAL (default 15m) against STRIPE_API_BASE (default
# https://api.stripe.com; a stand-in or stripe-mock in tests), for the types
# the handlers read, first reaching RECONCILE_LOOKBACK back (default 3d, at
# most 30d), RECONCILE_SETTLE behind now (default 1m, at most 5m), and stores
# what is missing for WEBHOOK_ENDPOINT; the worker drains it like any
# receipt. Every setting is checked at start.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/postgres.sh
. scripts/lib/postgres.sh

if [ -z "${DATABASE_URL:-}" ]; then
  pg_find_or_start DEV_SERVER_URL
  psql "$DEV_SERVER_URL" -XAtqc "SELECT 1 FROM pg_database WHERE datname = 'inbox_dev'" | grep -q 1 \
    || psql "$DEV_SERVER_URL" -Xqc "CREATE DATABASE inbox_dev" >/dev/null
  DATABASE_URL=${DEV_SERVER_URL/\/postgres\?/\/inbox_dev?}
fi
export DATABASE_URL
export LISTEN_ADDR=${LISTEN_ADDR:-127.0.0.1:8080}
export STRIPE_WEBHOOK_SECRET=${STRIPE_WEBHOOK_SECRET:-whsec_local_dev}
export WEBHOOK_ENDPOINT=${WEBHOOK_ENDPOINT:-billing}
export STRIPE_MODE=${STRIPE_MODE:-test}
# Locally the "invocation" is WORKER_TIMEOUT long; keep the margin below it.
export DEADLINE_MARGIN=${DEADLINE_MARGIN:-40s}

mkdir -p .tmp
go build -o .tmp/local ./cmd/local
go build -o .tmp/sendevent ./cmd/sendevent

cat <<MSG
Database: ${DATABASE_URL}
Send a signed sample event (in another shell):
  STRIPE_WEBHOOK_SECRET=$STRIPE_WEBHOOK_SECRET LISTEN_ADDR=$LISTEN_ADDR go run ./cmd/sendevent -type invoice.paid -invoice in_demo_1
Or forward Stripe's test events:
  stripe listen --forward-to $LISTEN_ADDR/$WEBHOOK_ENDPOINT   (then restart with STRIPE_WEBHOOK_SECRET=<the whsec_ it prints>)
Reconcile against Stripe's Events API: restart with STRIPE_API_KEY=rk_test_... (backfill: go run ./cmd/reconcile --since 72h)
MSG

.tmp/local &
pid=$!
trap 'kill -TERM $pid 2>/dev/null || true' INT TERM
wait $pid || true
wait $pid 2>/dev/null || true
