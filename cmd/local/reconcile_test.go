package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/config"
	"github.com/stripe-inbox/inbox/internal/config/configtest"
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

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	cfg, err := config.LoadLocal(configtest.MapEnv(map[string]string{
		"DATABASE_URL": db.URL, "LISTEN_ADDR": addr, "STRIPE_WEBHOOK_SECRET": "whsec_test",
		"LOCAL_COMPONENTS": "webhook,worker,reconcile", "WORKER_INTERVAL": "100ms", "POLL_INTERVAL": "0",
		"STRIPE_API_KEY": fakeapi.Key, "STRIPE_API_BASE": api.URL, "RECONCILE_INTERVAL": "1s", "RECONCILE_RATE": "100",
	}))
	require.NoError(t, err)
	require.True(t, cfg.Runs("reconcile"))

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, cfg, slog.New(slog.NewJSONHandler(io.Discard, nil))) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done, "the runner stops cleanly when cancelled")
	})
	deliver := func(payload []byte) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/billing", bytes.NewReader(payload))
			require.NoError(t, err)
			req.Header.Set("Stripe-Signature", stripetest.Sign(payload, time.Now(), "whsec_test"))
			res, err := http.DefaultClient.Do(req)
			if err == nil {
				_ = res.Body.Close()
				require.Equal(t, http.StatusOK, res.StatusCode)
				return
			}
			require.True(t, time.Now().Before(deadline), "the webhook never listened: %v", err)
			time.Sleep(10 * time.Millisecond) // waiting for the listener, not for time to pass
		}
	}
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
