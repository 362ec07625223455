package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/config"
	"github.com/stripe-inbox/inbox/internal/config/configtest"
	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/stripeapitest"
	"github.com/stripe-inbox/inbox/internal/stripetest"
)

// The local contract: with WRITEBACKS=customer_metadata, STRIPE_API_KEY and
// STRIPE_API_BASE set, the local runner sends write-backs to that base URL.
// Two Event objects for one payment, each delivered twice: one intent, one
// applied call, recorded.
func TestLocalRunnerSendsWritebacksToTheBaseURL(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	api := stripeapitest.New("cus_1")
	t.Cleanup(api.Close)

	addr := freeAddr(t)
	cfg := loadLocal(t, addr, map[string]string{
		"DATABASE_URL": db.URL, "STRIPE_WEBHOOK_SECRET": "whsec_test",
		"LOCAL_COMPONENTS": "webhook,worker", "WORKER_INTERVAL": "100ms", "POLL_INTERVAL": "0",
		"WRITEBACKS": "customer_metadata", "STRIPE_API_KEY": stripeapitest.Key, "STRIPE_API_BASE": api.URL, "WRITEBACK_INTERVAL": "100ms",
	})
	require.True(t, cfg.Writeback.Enabled)
	require.False(t, cfg.Runs("reconcile"))
	deliver := startRunner(t, cfg, addr)
	inv := stripetest.Invoice("in_1", "cus_1", "paid", 1000)
	first := stripetest.Event("evt_paid_1", "invoice.paid", inv)
	second := stripetest.Event("evt_paid_2", "invoice.paid", inv) // another Event object for the payment
	for _, p := range [][]byte{first, second, first, second} {
		deliver(p)
	}
	db.WaitUntil(t, "the write-back recorded", `SELECT count(*) = 1 FROM writeback_intents WHERE status = 'done' AND result_via = 'call'`)
	db.WaitUntil(t, "both receipts applied", `SELECT count(*) = 2 FROM webhook_inbox WHERE processed_at IS NOT NULL`)
	require.Equal(t, 1, db.Count(t, "writeback_intents", ""))
	require.Equal(t, 1, api.Applied(handlers.CustomerMetadataKey("in_1")))
	require.Equal(t, 1, api.AppliedTotal())
	require.Equal(t, map[string]string{handlers.LastPaidInvoiceKey: "in_1"}, api.Metadata("cus_1"))
}

// WRITEBACKS without a key fails at start, saying what to set.
func TestLocalWritebacksNeedAKey(t *testing.T) {
	t.Parallel()
	_, err := config.LoadLocal(configtest.MapEnv(map[string]string{
		"DATABASE_URL": "postgres://x@127.0.0.1/x", "STRIPE_WEBHOOK_SECRET": "whsec_test", "WRITEBACKS": "customer_metadata",
	}))
	require.ErrorContains(t, err, "WRITEBACKS=customer_metadata but STRIPE_API_KEY is not set")
	_, err = config.LoadLocal(configtest.MapEnv(map[string]string{
		"DATABASE_URL": "postgres://x@127.0.0.1/x", "STRIPE_WEBHOOK_SECRET": "whsec_test", "WRITEBACKS": "customer_meta",
	}))
	require.ErrorContains(t, err, `"customer_meta" is not a write-back this release ships`)
}
