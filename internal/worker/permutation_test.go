package worker_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/stripetest"
	"github.com/stripe-inbox/inbox/internal/worker"
)

// TestAnyOrderAndDuplicatesGiveTheSameResult delivers random mixes of
// several invoices' lifecycles, shuffled, with redeliveries of the same event
// and separate Event objects for the same fact, drained by four concurrent
// drainers, and compares the final state with what each lifecycle must end
// in: the ledger against the events' final facts (payments of paid invoices,
// out-of-band payments under their own kind, refunds that succeeded,
// reversed if they then failed, dispute funds withdrawn and reinstated, each
// under its invoice), the outbox (one row per booked movement), statuses of
// invoices, refunds and disputes, the newest snapshot's amount_due, and no effect of the
// test-mode events a live endpoint also receives. Set INBOX_PERMUTATION_SEED
// to replay a failing seed.
func TestAnyOrderAndDuplicatesGiveTheSameResult(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("INBOX_PERMUTATION_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		require.NoError(t, err)
		seed = v
	}
	for round := range 4 {
		roundSeed := seed + uint64(round)
		t.Run(fmt.Sprintf("seed=%d", roundSeed), func(t *testing.T) {
			t.Parallel()
			t.Logf("replay with INBOX_PERMUTATION_SEED=%d", roundSeed)
			r := rand.New(rand.NewPCG(roundSeed, 0))
			b := setup(t)

			// Every story twice, with the test-mode events a live endpoint
			// also receives, and a quarter of the facts as a second Event
			// object; each event delivered one to three times, shuffled.
			g := stripetest.NewGenerator(r, stripetest.Options{Livemode: true, OtherMode: true, TwinRate: 0.25, Each: true})
			var deliveries [][]byte
			for _, ev := range g.Shuffled(2 * len(stripetest.Stories)) {
				for range 1 + r.IntN(3) {
					deliveries = append(deliveries, ev.Payload)
				}
			}
			r.Shuffle(len(deliveries), func(i, j int) { deliveries[i], deliveries[j] = deliveries[j], deliveries[i] })
			want := g.Expect()
			// Receive in two waves with a drain in between, so that some events
			// are processed before others have even arrived.
			half := len(deliveries) / 2
			w := b.newWorker(t, nil, worker.Config{Mode: worker.ModeLive, Concurrency: 4, ClaimLimit: 3})
			for _, d := range deliveries[:half] {
				b.receive(t, d)
			}
			b.run(t, w)
			for _, d := range deliveries[half:] {
				b.receive(t, d)
			}
			s := b.run(t, w)
			failed := s.Failed
			// In batches, two transactions can deadlock across event types
			// (see ProcessBatch); the receipt is retried after its backoff.
			for round := 0; s.Remaining > 0 && round < 5; round++ {
				w.Now = at(time.Now().UTC().Add(time.Duration(round+1) * time.Hour))
				s = b.run(t, w)
				failed += s.Failed
			}
			require.Equal(t, 0, s.Remaining)
			if testBatchSize(t) == 1 {
				require.Equal(t, 0, failed, "one receipt per transaction never deadlocks")
			}
			require.Equal(t, 0, b.db.Count(t, "webhook_inbox", "processed_at IS NULL"))

			// The ledger holds exactly the entries the events' final facts
			// call for: each paid invoice's payment, and each refund that
			// succeeded (reversed if it then failed or was canceled), under
			// its invoice whichever event came first; nothing from test mode.
			require.Equal(t, want.LedgerLines(), b.ledger(t))
			rows, err := b.pool.Query(context.Background(), "SELECT invoice_id, sum(amount) FILTER (WHERE kind <> 'payment') FROM ledger_entries GROUP BY 1")
			require.NoError(t, err)
			gotNet := map[string]int64{}
			for rows.Next() {
				var inv string
				var net *int64
				require.NoError(t, rows.Scan(&inv, &net))
				if net != nil {
					gotNet[inv] = *net
				}
			}
			require.NoError(t, rows.Err())
			wantNet := map[string]int64{}
			for k, amount := range want.Ledger {
				if k.Kind != "payment" {
					wantNet[k.Invoice] += amount
				}
			}
			require.Equal(t, wantNet, gotNet, "net refunds per invoice")

			// The test-mode events are stored and ignored, and change nothing:
			// the invoices and refunds are exactly those of the live events.
			require.Equal(t, len(want.OtherMode), b.db.Count(t, "webhook_inbox", "outcome = 'ignored_other_mode' AND event_id = ANY ($1)", want.OtherMode))
			require.Equal(t, len(want.OtherMode), b.db.Count(t, "webhook_inbox", "NOT livemode"))
			gotInvoices := map[string]stripetest.InvoiceState{}
			rows, err = b.pool.Query(context.Background(), "SELECT id, status, amount_due, amount_paid FROM invoices")
			require.NoError(t, err)
			for rows.Next() {
				var id string
				var st stripetest.InvoiceState
				require.NoError(t, rows.Scan(&id, &st.Status, &st.AmountDue, &st.AmountPaid))
				gotInvoices[id] = st
			}
			require.NoError(t, rows.Err())
			require.Equal(t, want.Invoices, gotInvoices, "status, the newest snapshot's amount_due, the payment")
			gotRefunds := map[string]string{}
			rows, err = b.pool.Query(context.Background(), "SELECT id, status FROM refunds")
			require.NoError(t, err)
			for rows.Next() {
				var id, status string
				require.NoError(t, rows.Scan(&id, &status))
				gotRefunds[id] = status
			}
			require.NoError(t, rows.Err())
			require.Equal(t, want.Refunds, gotRefunds, "test-mode refunds are not even recorded")
			gotDisputes := map[string]string{}
			rows, err = b.pool.Query(context.Background(), "SELECT id, status FROM disputes")
			require.NoError(t, err)
			for rows.Next() {
				var id, status string
				require.NoError(t, rows.Scan(&id, &status))
				gotDisputes[id] = status
			}
			require.NoError(t, rows.Err())
			require.Equal(t, want.Disputes, gotDisputes, "each dispute's final status; test-mode disputes are not recorded")
			require.Equal(t, 0, b.db.Count(t, "anomalies", ""))
			// One notification per booked movement: each payment, each
			// payment outside Stripe, each dispute's withdrawal and
			// reinstatement; none twice, whatever the order and the twins.
			rows, err = b.pool.Query(context.Background(), "SELECT aggregate_id || ' ' || event_type FROM outbox ORDER BY 1")
			require.NoError(t, err)
			gotOutbox, err := pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(t, err)
			require.Equal(t, want.Notifications, gotOutbox)
		})
	}
}
