package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/stripetest"
	"github.com/stripe-inbox/inbox/internal/worker"
)

// withVersion returns payload with its api_version replaced.
func withVersion(t *testing.T, payload []byte, version string) []byte {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(payload, &m))
	m["api_version"] = version
	b, err := json.Marshal(m)
	require.NoError(t, err)
	return b
}

// TestEveryVersionBooksTheSameStory: one payment-and-refund story (created,
// finalized, paid, the invoice payment where the version has one, a refund
// pending then succeeded) in the shape of every API version Stripe sends
// today, on stripe-mock's objects, and of an invented future release. Each
// books the same ledger rows under its invoice; the invoice payment of type
// payment_record links and books nothing; nothing waits for review; only
// the invented release is counted as drift (the stage declares no version
// here, so that what is counted is the unnamed release).
func TestEveryVersionBooksTheSameStory(t *testing.T) {
	t.Parallel()
	b := setup(t)
	shapes := stripetest.Shapes()
	stories := 0
	for i, sh := range shapes {
		for _, ev := range sh.Story(fmt.Sprintf("v%d", i), stripetest.Created) {
			b.receive(t, ev.Payload)
			stories++
		}
	}
	w := b.newWorker(t, nil, worker.Config{Concurrency: 2})
	s := b.run(t, w)
	require.Equal(t, stories, s.Processed)
	require.Zero(t, s.Failed)
	require.Zero(t, s.NeedsReview)
	require.Equal(t, 0, b.db.Count(t, "webhook_inbox", "processed_at IS NULL OR outcome <> 'applied' OR last_error IS NOT NULL"))

	var want []string
	for i, sh := range shapes {
		key := fmt.Sprintf("v%d", i)
		want = append(want, sh.StoryLedger(key)...)
		t.Run(sh.Name, func(t *testing.T) {
			ids := sh.IDs(key)
			require.Equal(t, "paid", b.invoiceStatus(t, ids.Invoice))
			require.Equal(t, 0, b.db.Count(t, "payment_links", "payment_id = $1", ids.PaymentRecord), "a payment record links nothing")
			require.Equal(t, 1, b.db.Count(t, "payment_links", "invoice_id = $1", ids.Invoice), "one Stripe payment linked")
			require.Equal(t, 1, b.db.Count(t, "refunds", "id = $1 AND booked_under = $2", ids.Refund, ids.Invoice))
		})
	}
	require.ElementsMatch(t, want, ledgerLines(t, b))
	require.Equal(t, 0, b.db.Count(t, "anomalies", ""))

	invented := len(shapes[len(shapes)-1].Story("x", 0))
	require.Equal(t, invented, s.UnexpectedAPIVersion, "the invented release's deliveries, and only them")
	byVersion := driftByVersion(t, b.metrics.String())
	require.Equal(t, map[string]int{stripetest.InventedRelease: invented}, byVersion)
}

// driftByVersion sums the UnexpectedApiVersion lines with an ApiVersion
// dimension.
func driftByVersion(t *testing.T, emf string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(emf), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m))
		if n, ok := m["UnexpectedApiVersion"].(float64); ok {
			if v, ok := m["ApiVersion"].(string); ok {
				out[v] += int(n)
			}
		}
	}
	return out
}

// ledgerLines is every ledger entry as "invoice kind amount".
func ledgerLines(t *testing.T, b *testBundle) []string {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), "SELECT invoice_id || ' ' || kind || ' ' || amount FROM ledger_entries")
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return out
}

// TestWrongTypedFieldWaitsForReview: in any version, a field a handler
// reads that has another JSON type books nothing; the receipt uses up its
// attempts and waits for review with last_error naming the field, the
// event type and the version. Its story's other events book what they can.
func TestWrongTypedFieldWaitsForReview(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, sh := range []stripetest.Shape{stripetest.Shapes()[4], stripetest.Shapes()[len(stripetest.Shapes())-1]} {
		for _, ev := range sh.Story(strings.ReplaceAll(sh.Version, ".", "_"), stripetest.Created) {
			payload := ev.Payload
			if ev.Type == "invoice.paid" {
				var m map[string]any
				require.NoError(t, json.Unmarshal(payload, &m))
				m["data"].(map[string]any)["object"].(map[string]any)["amount_paid"] = "1000.00"
				var err error
				payload, err = json.Marshal(m)
				require.NoError(t, err)
			}
			b.receive(t, payload)
		}
	}
	w := b.newWorker(t, nil, worker.Config{Concurrency: 1, MaxAttempts: 2})
	w.Jitter = func() float64 { return 0 }
	now := future()
	for range 3 {
		w.Now = at(now)
		b.run(t, w)
		now = now.Add(time.Hour)
	}
	s := b.run(t, w)
	require.Equal(t, 2, s.NeedsReview)
	for _, v := range []string{"2025-10-29.clover", stripetest.InventedRelease} {
		require.Equal(t, 1, b.db.Count(t, "webhook_inbox", `processed_at IS NULL AND attempts = 2 AND event_type = 'invoice.paid' AND api_version = $1
		   AND last_error = 'bad_payload: event ' || event_id || ' (invoice.paid, api_version ' || $1 || '): data.object.amount_paid is a string; its handler reads an integer'`, v),
			v)
	}
	require.Equal(t, 0, b.db.Count(t, "ledger_entries", "kind = 'payment'"), "no payment booked from a field of another type")
	require.Equal(t, 0, b.db.Count(t, "webhook_inbox", "processed_at IS NULL AND event_type <> 'invoice.paid'"))
}

// TestUnnamedReleaseHeldForReview: with STRIPE_UNNAMED_RELEASES=hold, an
// event of a release the code has not named books nothing and waits for
// review, with a last_error that says what to do; named versions book as
// usual.
func TestUnnamedReleaseHeldForReview(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.receive(t, withVersion(t, paid("evt_future", "in_future"), stripetest.InventedRelease))
	b.receive(t, withVersion(t, paid("evt_dahlia", "in_dahlia"), "2026-03-25.dahlia"))
	b.receive(t, withVersion(t, paid("evt_garbled", "in_garbled"), "latest"))
	// A type without a handler is ignored whatever its version.
	b.receive(t, withVersion(t, stripetest.Event("evt_other", "customer.created", map[string]any{"id": "cus_1"}), stripetest.InventedRelease))

	w := b.newWorker(t, handlers.New(handlers.Options{UnnamedReleases: handlers.HoldUnnamed}), worker.Config{Concurrency: 1, MaxAttempts: 1})
	s := b.run(t, w)
	require.Equal(t, 2, s.Failed)
	require.Equal(t, []string{"in_dahlia payment 1000"}, ledgerLines(t, b))
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox",
		`event_id = 'evt_future' AND processed_at IS NULL AND last_error LIKE 'api_version: %"`+stripetest.InventedRelease+`"; read the release''s changelog%'`))
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox",
		`event_id = 'evt_garbled' AND processed_at IS NULL AND last_error LIKE 'api_version: %"latest" is not a Stripe API version%'`))
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "event_id = 'evt_other' AND outcome = 'ignored'"))
}
