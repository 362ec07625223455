package worker_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

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

// Events listed on the Events API carry the version they were created with,
// not the endpoint's. The same payment in the shapes of 2024-06-20 (the
// invoice names its charge) and of basil (the invoice lists its payments)
// books once each, and the refund of each charge is attributed to its
// invoice; an event of a release the handlers were not reviewed for books
// nothing and fails with a last_error that names its version.
func TestAPIVersionsBothShapesAndUnknownRelease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	old := stripetest.Invoice("in_old", "cus_1", "paid", 1000)
	old["charge"] = "ch_old"
	b.receive(t, withVersion(t, stripetest.Event("evt_old_paid", "invoice.paid", old), "2024-06-20"))
	b.receive(t, withVersion(t, stripetest.Event("evt_old_refund", "refund.updated", stripetest.RefundIn("re_old", "ch_old", "succeeded", 300)), "2024-06-20"))

	basil := stripetest.Invoice("in_basil", "cus_1", "paid", 2000)
	basil["payments"] = map[string]any{"data": []any{map[string]any{"payment": map[string]any{"charge": "ch_basil"}}}}
	b.receive(t, withVersion(t, stripetest.Event("evt_basil_paid", "invoice.paid", basil), "2025-08-27.basil"))
	b.receive(t, withVersion(t, stripetest.Event("evt_basil_refund", "refund.updated", stripetest.RefundIn("re_basil", "ch_basil", "succeeded", 500)), "2025-03-31.basil"))

	b.receive(t, withVersion(t, paid("evt_future", "in_future"), "2026-01-28.clover"))
	b.receive(t, withVersion(t, paid("evt_garbled", "in_garbled"), "latest"))
	// A type without a handler is ignored whatever its version.
	b.receive(t, withVersion(t, stripetest.Event("evt_other", "customer.created", map[string]any{"id": "cus_1"}), "2026-01-28.clover"))

	s := b.run(t, b.newWorker(t, nil, worker.Config{Concurrency: 1}))
	require.Equal(t, 2, s.Failed)
	require.Equal(t, []string{
		"in_basil payment 2000", "in_basil refund:re_basil -500",
		"in_old payment 1000", "in_old refund:re_old -300",
	}, b.ledger(t))
	require.Equal(t, 0, b.db.Count(t, "invoices", "id IN ('in_future', 'in_garbled')"))
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox",
		`event_id = 'evt_future' AND processed_at IS NULL AND last_error LIKE 'api_version: %"2026-01-28.clover" (release "clover")%'`))
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox",
		`event_id = 'evt_garbled' AND processed_at IS NULL AND last_error LIKE 'api_version: %"latest" is not a Stripe API version%'`))
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "event_id = 'evt_other' AND outcome = 'ignored'"))
}
