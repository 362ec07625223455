package main

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/config"
	"github.com/stripe-inbox/inbox/internal/eventbridgetest"
	"github.com/stripe-inbox/inbox/internal/pgtest"
)

// TestLocalRunnerRelaysTheOutboxWhenOutboxBusIsSet: the local contract.
// With OUTBOX_BUS set, the runner's worker relays the outbox to the bus,
// reached through the AWS SDK's usual configuration
// (AWS_ENDPOINT_URL_EVENTBRIDGE, AWS_REGION, static credentials), here a
// stand-in. Not parallel: the runner reads the process environment.
//
// The worker is the stack's default, not resident (POLL_INTERVAL=0): each
// run ends with the relay's final call. A resident worker on a 100 ms
// schedule (two overlapping 150 ms runs, each with its drainers, poller and
// listener on the pool) once went 30 s without publishing under the race
// detector on a loaded machine; what this test is about is the contract
// (OUTBOX_BUS and the SDK's endpoint setting), not that schedule.
func TestLocalRunnerRelaysTheOutboxWhenOutboxBusIsSet(t *testing.T) {
	db := pgtest.DB(t)
	eb := eventbridgetest.New(t, "local-bus")
	for _, kv := range append(eb.Env(), "DATABASE_URL="+db.URL, "OUTBOX_BUS=local-bus", "LOCAL_COMPONENTS=worker", "WORKER_INTERVAL=100ms", "POLL_INTERVAL=0") {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	var id int64
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('Invoice', 'in_local', 'InvoicePaymentBooked', '{"invoice_id":"in_local"}') RETURNING id`).Scan(&id))

	cfg, err := config.LoadLocal(os.Getenv)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, cfg, slog.New(slog.DiscardHandler)) }()
	db.WaitUntil(t, "the outbox row is published", "SELECT count(*) = 1 FROM outbox WHERE aggregate_id = 'in_local' AND published_at IS NOT NULL")
	cancel()
	require.NoError(t, <-done)
	require.Equal(t, map[int64]int{id: 1}, eb.Published())
}
