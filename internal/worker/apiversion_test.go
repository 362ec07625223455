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
// invoice names its charge) and of basil and later (the invoice lists its
// payments) books once each, and the refund of each charge is attributed to
// its invoice, whatever the release, named or not; a version that is not
// Stripe's books nothing and fails with a last_error that names it.
func TestAPIVersionsBothShapesAndUnknownRelease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	old := stripetest.Invoice("in_old", "cus_1", "paid", 1000)
	old["charge"] = "ch_old"
	b.receive(t, withVersion(t, stripetest.Event("evt_old_paid", "invoice.paid", old), "2024-06-20"))
	b.receive(t, withVersion(t, stripetest.Event("evt_old_refund", "refund.updated", stripetest.RefundIn("re_old", "ch_old", "succeeded", 300)), "2024-06-20"))
	for i, v := range []string{"2025-08-27.basil", "2026-01-28.clover", "2027-03-31.fig"} {
		inv, ch := "in_new"+string(rune('a'+i)), "ch_new"+string(rune('a'+i))
		o := stripetest.Invoice(inv, "cus_1", "paid", 2000)
		o["payments"] = map[string]any{"data": []any{map[string]any{"payment": map[string]any{"type": "charge", "charge": ch}}}}
		b.receive(t, withVersion(t, stripetest.Event("evt_paid_"+inv, "invoice.paid", o), v))
		b.receive(t, withVersion(t, stripetest.Event("evt_refund_"+inv, "refund.updated", stripetest.RefundIn("re_"+inv, ch, "succeeded", 500)), v))
	}
	b.receive(t, withVersion(t, paid("evt_garbled", "in_garbled"), "latest"))

	s := b.run(t, b.newWorker(t, nil, worker.Config{Concurrency: 1}))
	require.Equal(t, 1, s.Failed)
	require.Equal(t, []string{
		"in_newa payment 2000", "in_newa refund:re_in_newa -500",
		"in_newb payment 2000", "in_newb refund:re_in_newb -500",
		"in_newc payment 2000", "in_newc refund:re_in_newc -500",
		"in_old payment 1000", "in_old refund:re_old -300",
	}, b.ledger(t))
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox",
		`event_id = 'evt_garbled' AND processed_at IS NULL AND last_error LIKE 'api_version: %"latest" is not a Stripe API version%'`))
}
