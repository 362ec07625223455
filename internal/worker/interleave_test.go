package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/stripetest"
	"github.com/stripe-inbox/inbox/internal/worker"
)

// TestAnInterleavedReceiptThatWaitsForALockIsAppliedAlone: in one batch,
// a charge.refunded of in_1 links its charge, then wants to move the
// refund recorded before under the charge (a second statement); in_2's
// invoice.created runs between the two (receipts of different invoices
// interleave). Another session holds the refund's row, so the second
// statement, sent after a later invoice's, waits for it at most the
// interleaved lock wait: it gives up, the batch commits in_2 without it,
// and the receipt is applied on its own after the batch, where it waits
// until the row is free. Nothing is lost or doubled, and no deadlock.
func TestAnInterleavedReceiptThatWaitsForALockIsAppliedAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	// The refund first, on its own: recorded under its charge (no invoice
	// linked to ch_1 yet).
	b.receive(t, stripetest.Event("evt_r", "refund.created", stripetest.RefundIn("re_1", "ch_1", "succeeded", 300)))
	require.Equal(t, 1, b.run(t, b.newWorker(t, nil, worker.Config{Concurrency: 1})).Processed)

	b.receive(t, stripetest.Event("evt_c", "charge.refunded", stripetest.ChargeWithRefunds("ch_1", "in_1", map[string]int64{"re_1": 300})))
	b.receive(t, stripetest.Event("evt_i", "invoice.created", stripetest.Invoice("in_2", "cus_1", "draft", 500)))
	holder, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer holder.Rollback(ctx) //nolint:errcheck // released below
	_, err = holder.Exec(ctx, "SELECT 1 FROM refunds WHERE id = 're_1' FOR UPDATE")
	require.NoError(t, err)

	// Both receipts in one batch, whatever batch size the suite runs at
	// (TestEveryTestAtBatchSizeOne), and a statement timeout far above the
	// lock wait: the receipt applied on its own waits for the holder, not
	// for a timeout.
	w := b.newWorker(t, nil, worker.Config{Concurrency: 1, ClaimLimit: 2, BatchSize: 2, StatementTimeout: 30 * time.Second, DeadlineMargin: time.Minute, Lease: 2 * time.Minute})
	type result struct {
		s   worker.Summary
		err error
	}
	done := make(chan result, 1)
	go func() {
		s, err := w.Run(ctx)
		done <- result{s, err}
	}()
	b.db.WaitUntil(t, "the batch committed in_2 without the charge.refunded", "SELECT count(*) = 1 FROM invoices WHERE id = 'in_2'")
	b.db.WaitForLockWaiter(t) // the charge.refunded, applied on its own
	require.NoError(t, holder.Rollback(ctx))
	r := <-done
	require.NoError(t, r.err)
	require.Equal(t, 2, r.s.Processed)
	require.Equal(t, 1, r.s.LockWaits, "the interleaved statement gave up its lock wait")
	require.Zero(t, r.s.Deadlocks)
	require.Zero(t, r.s.Failed)
	require.Equal(t, []string{"in_1 refund:re_1 -300"}, b.ledger(t))
}
