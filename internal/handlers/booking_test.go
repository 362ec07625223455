package handlers_test

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/stripetest"
)

// TestABookingRunTwiceBooksTheSame: a Booking may run more than once (a
// batch that rolls a receipt back to its savepoint runs it again). Every
// event of every story, read once, is booked, rolled back and booked again
// with what it read: both runs report the same and leave the same rows, so
// no booking changes what its handler read in a way that books differently
// the second time.
func TestABookingRunTwiceBooksTheSame(t *testing.T) {
	b := setup(t, pgtest.DB(t))
	ctx := context.Background()
	g := stripetest.NewGenerator(rand.New(rand.NewPCG(7, 0)), stripetest.Options{Prefix: "twice", Livemode: true, TwinRate: 0.2})
	reg := handlers.Default()
	state := func() []string {
		return b.strings(t, `
SELECT 'invoice ' || i::text FROM invoices i UNION ALL
SELECT 'ledger ' || (l.invoice_id, l.kind, l.amount, l.event_id)::text FROM ledger_entries l UNION ALL
SELECT 'outbox ' || (o.aggregate_id, o.event_type, o.payload)::text FROM outbox o UNION ALL
SELECT 'refund ' || r::text FROM refunds r UNION ALL
SELECT 'dispute ' || d::text FROM disputes d UNION ALL
SELECT 'link ' || p::text FROM payment_links p UNION ALL
SELECT 'anomaly ' || (a.kind, a.subject_id, a.event_id, a.detail)::text FROM anomalies a`)
	}
	types := map[string]bool{}
	for _, ev := range g.Shuffled(40) {
		booking := reg.Read(handlers.Event{ID: ev.ID, Type: ev.Type, Endpoint: "billing", Payload: ev.Payload, Livemode: ev.Livemode})
		var results []handlers.Result
		var states [][]string
		for run := range 2 {
			_, err := b.tx.Exec(ctx, "SAVEPOINT twice")
			require.NoError(t, err)
			res, err := booking(ctx, b.tx)
			require.NoError(t, err, "%s %s, run %d", ev.Type, ev.ID, run)
			results, states = append(results, res), append(states, state())
			if run == 0 {
				_, err = b.tx.Exec(ctx, "ROLLBACK TO SAVEPOINT twice")
				require.NoError(t, err)
			}
		}
		require.Equal(t, results[0], results[1], "%s %s", ev.Type, ev.ID)
		require.Equal(t, states[0], states[1], "%s %s", ev.Type, ev.ID)
		types[ev.Type] = true
	}
	require.Subset(t, keys(types), []string{"invoice.created", "invoice.paid", "charge.refunded", "refund.created", "invoice_payment.paid", "charge.dispute.created"},
		"the stories cover the handlers that book money")
}

func keys(m map[string]bool) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}
