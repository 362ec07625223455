package worker_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/stripetest"
	"github.com/stripe-inbox/inbox/internal/worker"
)

// TestBacklogWithRefundsDrainsWithoutDeadlocks: four drainers in batches of
// 50 work through a shuffled backlog of every story (invoices, payments,
// refunds that succeed, fail or are canceled, PaymentIntent payments, twins)
// and no receipt is ever a deadlock's victim: batches take an invoice's rows
// in one order (lockOrder), and refunds whose charge is not linked yet are
// applied after the batch, in a transaction whose lock waits are bounded
// (splitUnplaced, unplacedLockWait). Before that, such a drain had deadlock
// after deadlock, each costing deadlock_timeout. The end state is the
// stories' own.
func TestBacklogWithRefundsDrainsWithoutDeadlocks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	g := stripetest.NewGenerator(rand.New(rand.NewPCG(11, 12)), stripetest.Options{TwinRate: 0.1, Each: true})
	for _, ev := range g.Shuffled(12 * len(stripetest.Stories)) {
		b.receive(t, ev.Payload)
	}
	// A statement timeout well above deadlock_timeout (1 s), so that a
	// deadlock shows as one and not as a timeout.
	w := b.newWorker(t, nil, worker.Config{Concurrency: 4, ClaimLimit: 50, StatementTimeout: 5 * time.Second, Lease: 10 * time.Minute})
	s := b.run(t, w)
	require.Zero(t, s.Deadlocks, "receipts rolled back as a deadlock's victim")
	require.Zero(t, s.Failed)
	require.Zero(t, s.Remaining)
	require.Equal(t, g.Expect().LedgerLines(), b.ledger(t))
}
