package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/reconcile"
	"github.com/stripe-inbox/inbox/internal/reconcile/fakeapi"
	"github.com/stripe-inbox/inbox/internal/stripetest"
)

// End to end through the local runner: half of an invoice's lifecycle
// reaches the webhook, the rest only Stripe's Events API (the stand-in);
// the reconciler stores what is missing, and the worker applies every event
// once: one payment, one refund, one notification.
func TestHalfDeliveredHalfReconciledAppliesOnce(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	api := fakeapi.New("")
	t.Cleanup(api.Close)

	now := time.Now()
	// Older than the settle window (an hour), as events Stripe has stopped
	// retrying soon are: the reconciler lists them at once.
	at := func(ago time.Duration) stripetest.Meta {
		return stripetest.Meta{Created: now.Add(-reconcile.DefaultSettle - ago).Unix()}
	}
	created := stripetest.EventWith("evt_created", "invoice.created", at(50*time.Minute), stripetest.Invoice("in_1", "cus_1", "draft", 1000))
	finalized := stripetest.EventWith("evt_finalized", "invoice.finalized", at(40*time.Minute), stripetest.Invoice("in_1", "cus_1", "open", 1000))
	paid := stripetest.EventWith("evt_paid", "invoice.paid", at(30*time.Minute), stripetest.Invoice("in_1", "cus_1", "paid", 1000))
	refunded := stripetest.EventWith("evt_refunded", "charge.refunded", at(20*time.Minute),
		stripetest.ChargeWithRefunds("ch_1", "in_1", map[string]int64{"re_1": 300}))
	// What the webhook never got is on the list from the start.
	api.Add(paid, refunded)

	addr := freeAddr(t)
	cfg := loadLocal(t, addr, map[string]string{
		"DATABASE_URL": db.URL, "STRIPE_WEBHOOK_SECRET": "whsec_test",
		"LOCAL_COMPONENTS": "webhook,worker,reconcile", "WORKER_INTERVAL": "100ms", "POLL_INTERVAL": "0",
		"STRIPE_API_KEY": fakeapi.Key, "STRIPE_API_BASE": api.URL, "RECONCILE_INTERVAL": "1s", "RECONCILE_RATE": "100",
	})
	require.True(t, cfg.Runs("reconcile"))
	deliver := startRunner(t, cfg, addr)
	deliver(created)
	deliver(finalized)
	// Stripe lists these too; the reconciler's next runs find them present.
	api.Add(created, finalized)

	db.WaitUntil(t, "all four receipts applied",
		`SELECT count(*) = 4 FROM webhook_inbox WHERE processed_at IS NOT NULL AND outcome = 'applied'`)
	db.WaitUntil(t, "the reconciler advanced its mark", `SELECT count(*) = 1 FROM reconcile_high_water WHERE endpoint = 'billing'`)
	require.Equal(t, 4, db.Count(t, "webhook_inbox", ""))
	require.Equal(t, 2, db.Count(t, "webhook_inbox", "source = 'reconcile' AND event_id IN ('evt_paid', 'evt_refunded')"))
	require.Equal(t, 2, db.Count(t, "webhook_inbox", "source = 'webhook' AND event_id IN ('evt_created', 'evt_finalized')"))
	require.Equal(t, 1, db.Count(t, "ledger_entries", "invoice_id = 'in_1' AND kind = 'payment' AND amount = 1000"))
	require.Equal(t, 1, db.Count(t, "ledger_entries", "invoice_id = 'in_1' AND kind = 'refund:re_1' AND amount = -300"))
	require.Equal(t, 2, db.Count(t, "ledger_entries", ""))
	require.Equal(t, 1, db.Count(t, "invoices", "id = 'in_1' AND status = 'paid'"))
	require.Equal(t, 1, db.Count(t, "outbox", "event_type = 'InvoicePaymentBooked'"))
}
