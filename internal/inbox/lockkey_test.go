package inbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/stripeevent"
	"github.com/stripe-inbox/inbox/internal/stripetest"
)

// TestClaimTellsTheInvoiceEachEventBelongsTo: the claim's LockKey (the
// order a batch applies receipts in) is the invoice an event belongs to:
// the invoice itself, a charge's invoice field, or what payment_links knows
// of a refund's charge; a refund of a charge not linked yet keeps its
// charge, and the worker then applies it alone (splitUnplaced).
func TestClaimTellsTheInvoiceEachEventBelongsTo(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.db.Pool.Exec(ctx, `INSERT INTO payment_links (payment_id, invoice_id) VALUES ('ch_linked', 'in_linked'), ('pi_linked', 'in_pi')`)
	require.NoError(t, err)
	for id, payload := range map[string][]byte{
		"evt_invoice":   stripetest.Event("evt_invoice", "invoice.paid", stripetest.Invoice("in_1", "cus_1", "paid", 1000)),
		"evt_charge":    stripetest.Event("evt_charge", "charge.refunded", stripetest.ChargeWithRefunds("ch_2", "in_2", map[string]int64{"re_2": 500})),
		"evt_linked":    stripetest.Event("evt_linked", "refund.created", stripetest.Refund("re_3", "ch_linked", 300)),
		"evt_unlinked":  stripetest.Event("evt_unlinked", "refund.created", stripetest.Refund("re_4", "ch_unlinked", 300)),
		"evt_other_obj": stripetest.Event("evt_other_obj", "customer.updated", map[string]any{"id": "cus_9", "object": "customer"}),
		// A charge of 2025-03-31.basil and later has no invoice field; its link tells.
		"evt_basil_charge": stripetest.Event("evt_basil_charge", "charge.refunded", map[string]any{"id": "ch_linked", "object": "charge"}),
		"evt_null_invoice": stripetest.Event("evt_null_invoice", "charge.refunded", map[string]any{"id": "ch_5", "object": "charge", "invoice": nil}),
		"evt_inpay":        stripetest.Event("evt_inpay", "invoice_payment.paid", map[string]any{"id": "inpay_6", "object": "invoice_payment", "invoice": "in_6"}),
		"evt_expanded":     stripetest.Event("evt_expanded", "invoice_payment.paid", map[string]any{"id": "inpay_7", "object": "invoice_payment", "invoice": map[string]any{"id": "in_7", "object": "invoice"}}),
		"evt_pi_refund":    stripetest.Event("evt_pi_refund", "refund.updated", map[string]any{"id": "re_8", "object": "refund", "payment_intent": "pi_linked"}),
	} {
		ev, err := stripeevent.Verify(payload, stripetest.Sign(payload, time.Now(), secret), []string{secret})
		require.NoError(t, err)
		_, err = inbox.Store(ctx, b.db.Pool, "billing", ev)
		require.NoError(t, err, id)
	}
	got := map[string]string{}
	for _, c := range b.claim(t, b.now, 10, 10) {
		got[c.EventID] = c.LockKey
	}
	require.Equal(t, map[string]string{
		"evt_invoice":      "in_1",
		"evt_charge":       "in_2",
		"evt_linked":       "in_linked",
		"evt_unlinked":     "ch_unlinked",
		"evt_other_obj":    "cus_9",
		"evt_basil_charge": "in_linked",
		"evt_null_invoice": "ch_5",
		"evt_inpay":        "in_6",
		"evt_expanded":     "in_7",
		"evt_pi_refund":    "in_pi",
	}, got)
}
