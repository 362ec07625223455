package worker_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/stripetest"
	"github.com/stripe-inbox/inbox/internal/worker"
)

// TestTwoDrainersDoNotApplyOneInvoiceAtOnce: two drainers claim two
// receipts each, the first of each claim of invoice in_k. The drainer
// whose in_k handler starts first holds it until the other drainer has
// claimed again (so it has done whatever it does with its in_k receipt) or
// that receipt's handler has started. Before owners, the other drainer
// applied its in_k receipt at once, in a batch of its own that waited on
// the first one's locks; now it hands the receipt to the drainer applying
// in_k, which applies it after its batch. Every receipt is applied once.
func TestTwoDrainersDoNotApplyOneInvoiceAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.receive(t, stripetest.Event("evt_k1", "invoice.created", stripetest.Invoice("in_k", "cus_1", "draft", 1000)))
	b.receive(t, stripetest.Event("evt_z1", "invoice.created", stripetest.Invoice("in_z1", "cus_1", "draft", 1000)))
	b.receive(t, paid("evt_k2", "in_k"))
	b.receive(t, stripetest.Event("evt_z2", "invoice.created", stripetest.Invoice("in_z2", "cus_1", "draft", 1000)))
	b.receive(t, stripetest.Event("evt_z3", "invoice.created", stripetest.Invoice("in_z3", "cus_1", "draft", 1000)))

	var (
		mu               sync.Mutex
		inK, started     int
		overlapped       bool
		errGaveUpWaiting = errors.New("gave up waiting until the other drainer claimed again or applied its in_k receipt")
	)
	reg := handlers.Default()
	for _, typ := range []string{"invoice.created", "invoice.paid"} {
		real := reg[typ]
		reg[typ] = handlers.HandlerFunc(func(ctx context.Context, tx handlers.DB, ev handlers.Event) (handlers.Result, error) {
			if ev.ID != "evt_k1" && ev.ID != "evt_k2" {
				return real(ev)(ctx, tx)
			}
			mu.Lock()
			inK++
			started++
			overlapped = overlapped || inK > 1
			first := started == 1
			mu.Unlock()
			defer func() { mu.Lock(); inK--; mu.Unlock() }()
			if first {
				deadline := time.Now().Add(30 * time.Second)
				for {
					mu.Lock()
					o := overlapped
					mu.Unlock()
					var claimedAgain bool
					if err := b.pool.QueryRow(ctx, "SELECT attempts > 0 FROM webhook_inbox WHERE event_id = 'evt_z3'").Scan(&claimedAgain); err != nil {
						return handlers.Result{}, err // the receipt fails, and the test's counts with it
					}
					if o || claimedAgain {
						break
					}
					if time.Now().After(deadline) {
						return handlers.Result{}, errGaveUpWaiting
					}
					time.Sleep(5 * time.Millisecond)
				}
			}
			return real(ev)(ctx, tx)
		})
	}
	w := b.newWorker(t, reg, worker.Config{Concurrency: 2, ClaimLimit: 2})
	s, err := w.Run(context.Background())
	require.NoError(t, err)
	require.False(t, overlapped, "two drainers applied in_k's receipts at once")
	require.Equal(t, 5, s.Processed)
	require.Equal(t, "paid", b.invoiceStatus(t, "in_k"))
	require.Equal(t, 1, b.db.Count(t, "ledger_entries", "invoice_id = 'in_k'"))
	require.Equal(t, 0, b.db.Count(t, "webhook_inbox", "processed_at IS NULL"))
}
