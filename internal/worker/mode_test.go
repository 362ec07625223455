package worker_test

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/stripetest"
	"github.com/stripe-inbox/inbox/internal/worker"
)

// ledger returns the ledger as sorted "invoice_id kind amount" lines.
func (b *testBundle) ledger(t *testing.T) []string {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), "SELECT invoice_id || ' ' || kind || ' ' || amount FROM ledger_entries ORDER BY 1")
	require.NoError(t, err)
	var got []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		got = append(got, s)
	}
	require.NoError(t, rows.Err())
	return got
}

func live(id, typ string, object map[string]any) []byte {
	return stripetest.EventWith(id, typ, stripetest.Meta{Created: stripetest.Created, Livemode: true, Account: "acct_1"}, object)
}

// Point 1: an event of the other mode is stored and marked processed as
// ignored_other_mode; it never touches invoices, the ledger or the outbox.
func TestOtherModeEventsAreStoredButNeverBooked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A live deployment: a connected account's test-mode events reach it too.
	b.receive(t, stripetest.Event("evt_test_paid", "invoice.paid", stripetest.Invoice("in_test", "cus_1", "paid", 1000)))
	b.receive(t, stripetest.Event("evt_test_refund", "charge.refunded", stripetest.ChargeWithRefunds("ch_test", "in_test", map[string]int64{"re_test": 300})))
	b.receive(t, stripetest.Event("evt_test_void", "invoice.voided", stripetest.Invoice("in_live", "cus_1", "void", 500)))
	b.receive(t, live("evt_live_paid", "invoice.paid", stripetest.Invoice("in_live", "cus_1", "paid", 500)))
	w := b.newWorker(t, nil, worker.Config{Mode: worker.ModeLive, Concurrency: 1})
	s := b.run(t, w)

	require.Equal(t, 3, s.IgnoredOtherMode)
	require.Equal(t, 1, s.Processed)
	require.Equal(t, 0, s.Anomalies, "the test-mode void must not make the live payment an anomaly")
	require.Equal(t, 3, b.db.Count(t, "webhook_inbox", "outcome = 'ignored_other_mode' AND processed_at IS NOT NULL AND NOT livemode"))
	require.Equal(t, []string{"in_live payment 500"}, b.ledger(t))
	require.Equal(t, 0, b.db.Count(t, "invoices", "id = 'in_test'"))
	require.Equal(t, "paid", b.invoiceStatus(t, "in_live"))
	require.Equal(t, 1, b.db.Count(t, "outbox", ""))
	require.Equal(t, 0, b.db.Count(t, "refunds", ""))
	require.Contains(t, lastEMF(t, b.metrics), `"IgnoredOtherMode":3`)

	// A test deployment ignores live events the same way.
	b2 := setup(t)
	b2.receive(t, live("evt_live_paid", "invoice.paid", stripetest.Invoice("in_live", "cus_1", "paid", 500)))
	b2.receive(t, stripetest.Event("evt_test_paid", "invoice.paid", stripetest.Invoice("in_test", "cus_1", "paid", 1000)))
	s = b2.run(t, b2.newWorker(t, nil, worker.Config{Mode: worker.ModeTest, Concurrency: 1}))
	require.Equal(t, 1, s.IgnoredOtherMode)
	require.Equal(t, []string{"in_test payment 1000"}, b2.ledger(t))
}

// Handlers receive the event's livemode and account.
func TestHandlersReceiveLivemodeAndAccount(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var (
		mu  sync.Mutex
		got []handlers.Event
	)
	reg := handlers.Registry{"invoice.paid": handlers.HandlerFunc(func(_ context.Context, _ handlers.DB, ev handlers.Event) (handlers.Result, error) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, handlers.Event{ID: ev.ID, Livemode: ev.Livemode, Account: ev.Account})
		return handlers.Result{Outcome: handlers.Applied}, nil
	})}
	b.receive(t, live("evt_connect", "invoice.paid", stripetest.Invoice("in_1", "cus_1", "paid", 1)))
	b.receive(t, stripetest.EventWith("evt_platform", "invoice.paid", stripetest.Meta{Livemode: true}, stripetest.Invoice("in_2", "cus_1", "paid", 1)))
	b.run(t, b.newWorker(t, reg, worker.Config{Mode: worker.ModeLive, Concurrency: 1}))
	slices.SortFunc(got, func(a, b handlers.Event) int { return cmpString(a.ID, b.ID) })
	require.Equal(t, []handlers.Event{{ID: "evt_connect", Livemode: true, Account: "acct_1"}, {ID: "evt_platform", Livemode: true}}, got)
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
