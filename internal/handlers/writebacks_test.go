package handlers_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/stripetest"
)

var writebacksOn = handlers.New(handlers.Options{Writebacks: []string{handlers.WritebackCustomerMetadata}})

// applyWith runs reg's handler for a live-mode event of type typ about
// object, under a fresh event id (a new Event object each call).
func (b *testBundle) applyWith(t *testing.T, reg handlers.Registry, typ string, object map[string]any) handlers.Result {
	t.Helper()
	b.seq++
	id := fmt.Sprintf("evt_wb_%d", b.seq)
	payload := stripetest.EventWith(id, typ, stripetest.Meta{Created: stripetest.Created + int64(b.seq), Livemode: true}, object)
	res, err := reg.Apply(context.Background(), b.tx, handlers.Event{ID: id, Type: typ, Endpoint: "billing", Payload: payload, Livemode: true})
	require.NoError(t, err, "%s %v", typ, object)
	return res
}

// intents is every write-back intent as "kind target key params event", sorted.
func (b *testBundle) intents(t *testing.T) []string {
	return b.strings(t, "SELECT kind || ' ' || target || ' ' || idempotency_key || ' ' || params::text || ' ' || status FROM writeback_intents")
}

// With the sample write-back on, a payment newly booked records one intent
// in the booking's statement; two Event objects for the payment (and each
// redelivered) record one; an invoice event that books nothing records
// nothing; with it off nothing is recorded.
func TestPaymentBookedRecordsOneWritebackIntent(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	want := func(inv, cus string) []string {
		return []string{fmt.Sprintf(`customer_metadata %s %s {"metadata": {"inbox_last_paid_invoice": "%s"}} pending`, cus, handlers.CustomerMetadataKey(inv), inv)}
	}

	t.Run("two Event objects for one payment", func(t *testing.T) {
		t.Parallel()
		b := setup(t, db)
		paid := stripetest.Invoice("in_wb_1", "cus_wb_1", "paid", 2000)
		for range 2 {
			b.applyWith(t, writebacksOn, "invoice.paid", paid) // a new Event object each time
			require.Equal(t, want("in_wb_1", "cus_wb_1"), b.intents(t))
		}
		// Later events about the paid invoice ask for nothing.
		b.applyWith(t, writebacksOn, "invoice.voided", stripetest.Invoice("in_wb_1", "cus_wb_1", "void", 2000))
		b.applyWith(t, writebacksOn, "invoice.finalized", stripetest.Invoice("in_wb_1", "cus_wb_1", "open", 2000))
		require.Equal(t, want("in_wb_1", "cus_wb_1"), b.intents(t))
		require.Equal(t, []string{"in_wb_1 payment 2000"}, b.ledger(t))
	})

	t.Run("payment on a void invoice is booked and asks for one write-back", func(t *testing.T) {
		t.Parallel()
		b := setup(t, db)
		b.applyWith(t, writebacksOn, "invoice.voided", stripetest.Invoice("in_wb_2", "cus_wb_2", "void", 2000))
		res := b.applyWith(t, writebacksOn, "invoice.paid", stripetest.Invoice("in_wb_2", "cus_wb_2", "paid", 2000))
		require.True(t, res.Anomaly) // payment_on_void_invoice, for a human
		require.Equal(t, []string{"in_wb_2 payment 2000"}, b.ledger(t))
		require.Equal(t, want("in_wb_2", "cus_wb_2"), b.intents(t))
		b.applyWith(t, writebacksOn, "invoice.paid", stripetest.Invoice("in_wb_2", "cus_wb_2", "paid", 2000))
		require.Equal(t, want("in_wb_2", "cus_wb_2"), b.intents(t), "a second Event object asks for nothing more")
	})

	t.Run("an invoice without a customer has no one to write back to", func(t *testing.T) {
		t.Parallel()
		b := setup(t, db)
		inv := stripetest.Invoice("in_wb_3", "", "paid", 2000)
		inv["customer"] = nil
		b.applyWith(t, writebacksOn, "invoice.paid", inv)
		require.Equal(t, []string{"in_wb_3 payment 2000"}, b.ledger(t))
		require.Empty(t, b.intents(t))
	})

	t.Run("a connected account's paid invoice records none", func(t *testing.T) {
		t.Parallel()
		b := setup(t, db)
		b.seq++
		id := fmt.Sprintf("evt_wb_%d", b.seq)
		inv := stripetest.Invoice("in_wb_6", "cus_wb_6", "paid", 2000)
		payload := stripetest.EventWith(id, "invoice.paid", stripetest.Meta{Created: stripetest.Created + int64(b.seq), Livemode: true, Account: "acct_wb_1"}, inv)
		_, err := writebacksOn.Apply(context.Background(), b.tx, handlers.Event{ID: id, Type: "invoice.paid", Endpoint: "billing", Payload: payload, Livemode: true, Account: "acct_wb_1"})
		require.NoError(t, err)
		require.Equal(t, []string{"in_wb_6 payment 2000"}, b.ledger(t), "booked")
		require.Empty(t, b.intents(t), "its customer lives in the connected account: the call would need Stripe-Account")
	})

	// invoice.paid has a statement of its own for an invoice that names a
	// payment (it records the payment's link too): the same intent, once,
	// with the write-back on; none with it off.
	t.Run("an invoice that names its charge", func(t *testing.T) {
		t.Parallel()
		b := setup(t, db)
		inv := stripetest.Invoice("in_wb_7", "cus_wb_7", "paid", 2000)
		inv["charge"] = "ch_wb_7"
		for range 2 {
			b.applyWith(t, writebacksOn, "invoice.paid", inv)
			require.Equal(t, want("in_wb_7", "cus_wb_7"), b.intents(t))
		}
		off := stripetest.Invoice("in_wb_8", "cus_wb_8", "paid", 2000)
		off["charge"] = "ch_wb_8"
		b.applyWith(t, handlers.Default(), "invoice.paid", off)
		require.Equal(t, want("in_wb_7", "cus_wb_7"), b.intents(t), "with the write-back off, none")
		require.Equal(t, []string{"in_wb_7 payment 2000", "in_wb_8 payment 2000"}, b.ledger(t))
		require.Equal(t, []string{"ch_wb_7 in_wb_7", "ch_wb_8 in_wb_8"},
			b.strings(t, "SELECT payment_id || ' ' || invoice_id FROM payment_links"), "both statements record the link")
	})

	t.Run("off by default", func(t *testing.T) {
		t.Parallel()
		b := setup(t, db)
		b.applyWith(t, handlers.Default(), "invoice.paid", stripetest.Invoice("in_wb_4", "cus_wb_4", "paid", 2000))
		require.Equal(t, []string{"in_wb_4 payment 2000"}, b.ledger(t))
		require.Empty(t, b.intents(t))
		// Turned on later: the booked payment asks for nothing, a new one does.
		b.applyWith(t, writebacksOn, "invoice.paid", stripetest.Invoice("in_wb_4", "cus_wb_4", "paid", 2000))
		require.Empty(t, b.intents(t))
		b.applyWith(t, writebacksOn, "invoice.paid", stripetest.Invoice("in_wb_5", "cus_wb_4", "paid", 2000))
		require.Equal(t, want("in_wb_5", "cus_wb_4"), b.intents(t))
	})
}

// The booking and its intent commit together or not at all: a processing
// transaction rolled back after the handler leaves neither.
func TestWritebackIntentRollsBackWithTheBooking(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	ctx := context.Background()
	b := setup(t, db)
	_, err := b.tx.Exec(ctx, "SAVEPOINT before")
	require.NoError(t, err)
	b.applyWith(t, writebacksOn, "invoice.paid", stripetest.Invoice("in_wb_rb", "cus_wb_rb", "paid", 2000))
	require.Len(t, b.intents(t), 1)
	_, err = b.tx.Exec(ctx, "ROLLBACK TO SAVEPOINT before")
	require.NoError(t, err)
	require.Empty(t, b.intents(t))
	require.Empty(t, b.ledger(t))
}

func TestWritebacksSetting(t *testing.T) {
	t.Parallel()
	require.Nil(t, handlers.ParseWritebacks(""))
	require.Nil(t, handlers.ParseWritebacks("off"))
	require.Equal(t, []string{"customer_metadata"}, handlers.ParseWritebacks(" customer_metadata ,customer_metadata"))
	require.NoError(t, handlers.Options{Writebacks: handlers.ParseWritebacks("customer_metadata")}.Validate())
	err := handlers.Options{Writebacks: handlers.ParseWritebacks("customer_metadata,charge_metadata")}.Validate()
	require.ErrorContains(t, err, `"charge_metadata" is not a write-back this release ships`)
}
