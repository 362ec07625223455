package handlers_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/stripetest"
)

// The handlers are tested here on their own, on a real migrated database:
// each case runs in a transaction of its own that is rolled back, as the
// worker runs a handler inside its processing transaction. The worker's
// suites test them again through claims, batches and concurrency.

type testBundle struct {
	tx  pgx.Tx
	seq int
}

// setup gives a case a transaction on db, rolled back when the case ends.
func setup(t *testing.T, db *pgtest.Database) *testBundle {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.WithoutCancel(ctx)) })
	return &testBundle{tx: tx}
}

// apply runs the registered handler for a live-mode event of type typ about
// object, as the worker would.
func (b *testBundle) apply(t *testing.T, typ string, object map[string]any) handlers.Result {
	t.Helper()
	res, err := b.applyErr(typ, object)
	require.NoError(t, err, "%s %v", typ, object)
	return res
}

func (b *testBundle) applyErr(typ string, object map[string]any) (handlers.Result, error) {
	b.seq++
	id := fmt.Sprintf("evt_%d", b.seq)
	payload := stripetest.EventWith(id, typ, stripetest.Meta{Created: stripetest.Created + int64(b.seq), Livemode: true}, object)
	return handlers.Default().Apply(context.Background(), b.tx, handlers.Event{
		ID: id, Type: typ, Endpoint: "billing", Payload: payload, Livemode: true,
	})
}

func (b *testBundle) strings(t *testing.T, sql string, args ...any) []string {
	t.Helper()
	rows, err := b.tx.Query(context.Background(), sql, args...)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	if len(out) == 0 {
		return nil
	}
	slices.Sort(out)
	return out
}

// ledger is every ledger entry as "invoice_id kind amount", sorted.
func (b *testBundle) ledger(t *testing.T) []string {
	return b.strings(t, "SELECT invoice_id || ' ' || kind || ' ' || amount FROM ledger_entries")
}

func (b *testBundle) status(t *testing.T, inv string) string {
	t.Helper()
	var s string
	err := b.tx.QueryRow(context.Background(), "SELECT status FROM invoices WHERE id = $1", inv).Scan(&s)
	if errors.Is(err, pgx.ErrNoRows) {
		return ""
	}
	require.NoError(t, err)
	return s
}

// invoiceEvent is the event that reports an invoice in each status.
var invoiceEvent = map[string]string{
	"draft":         "invoice.created",
	"open":          "invoice.finalized",
	"paid":          "invoice.paid",
	"void":          "invoice.voided",
	"uncollectible": "invoice.marked_uncollectible",
}

// TestInvoiceTransitions: every invoice event on an invoice in every state.
// Transitions only move forward (draft -> open -> uncollectible -> paid or
// void; paid and void are final), an event for an unknown invoice creates
// it in the event's status, a payment is booked once with one outbox row,
// and a payment and a void of one invoice end the same in either order: the
// invoice paid, the payment booked, one anomaly. Each event is applied
// twice: a redelivery changes nothing.
func TestInvoiceTransitions(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	type want struct {
		status  string
		paid    bool // one payment entry and one InvoicePaymentBooked
		anomaly string
	}
	// from "" is an invoice the inbox has not seen.
	cases := []struct {
		from, event string
		want        want
	}{
		{"", "invoice.created", want{status: "draft"}},
		{"", "invoice.finalized", want{status: "open"}},
		{"", "invoice.paid", want{status: "paid", paid: true}},
		{"", "invoice.voided", want{status: "void"}},
		{"", "invoice.marked_uncollectible", want{status: "uncollectible"}},

		{"draft", "invoice.created", want{status: "draft"}},
		{"draft", "invoice.finalized", want{status: "open"}},
		{"draft", "invoice.paid", want{status: "paid", paid: true}},
		{"draft", "invoice.voided", want{status: "void"}},
		{"draft", "invoice.marked_uncollectible", want{status: "uncollectible"}},

		{"open", "invoice.created", want{status: "open"}},
		{"open", "invoice.finalized", want{status: "open"}},
		{"open", "invoice.paid", want{status: "paid", paid: true}},
		{"open", "invoice.voided", want{status: "void"}},
		{"open", "invoice.marked_uncollectible", want{status: "uncollectible"}},

		{"uncollectible", "invoice.created", want{status: "uncollectible"}},
		{"uncollectible", "invoice.finalized", want{status: "uncollectible"}},
		{"uncollectible", "invoice.paid", want{status: "paid", paid: true}},
		{"uncollectible", "invoice.voided", want{status: "void"}},
		{"uncollectible", "invoice.marked_uncollectible", want{status: "uncollectible"}},

		{"paid", "invoice.created", want{status: "paid", paid: true}},
		{"paid", "invoice.finalized", want{status: "paid", paid: true}},
		{"paid", "invoice.paid", want{status: "paid", paid: true}},
		// A void after the payment, and a payment after a void, end the
		// same: paid, booked, one anomaly for a human (issue 23).
		{"paid", "invoice.voided", want{status: "paid", paid: true, anomaly: "payment_on_void_invoice"}},
		{"paid", "invoice.marked_uncollectible", want{status: "paid", paid: true}},

		{"void", "invoice.created", want{status: "void"}},
		{"void", "invoice.finalized", want{status: "void"}},
		{"void", "invoice.paid", want{status: "paid", paid: true, anomaly: "payment_on_void_invoice"}},
		{"void", "invoice.voided", want{status: "void"}},
		{"void", "invoice.marked_uncollectible", want{status: "void"}},
	}
	for i, tc := range cases {
		t.Run(fmt.Sprintf("%s+%s", or(tc.from, "none"), tc.event), func(t *testing.T) {
			t.Parallel()
			b := setup(t, db)
			// Ids of its own: the cases' transactions run side by side.
			inv, amount := fmt.Sprintf("in_%02d", i), int64(2500)
			object := func(status string) map[string]any { return stripetest.Invoice(inv, "cus_1", status, amount) }
			if tc.from != "" {
				res := b.apply(t, invoiceEvent[tc.from], object(tc.from))
				require.Equal(t, handlers.Applied, res.Outcome)
				require.Equal(t, tc.from, b.status(t, inv), "the invoice starts %s", tc.from)
			}
			target := ""
			for s, e := range invoiceEvent {
				if e == tc.event {
					target = s
				}
			}
			for delivery := range 2 {
				res := b.apply(t, tc.event, object(target))
				require.Equal(t, handlers.Applied, res.Outcome)
				// The second payment on a void invoice finds it paid by the
				// first: nothing to raise. A second void finds it paid too,
				// and raises the anomaly again (the row is already there).
				raised := tc.want.anomaly != "" && (delivery == 0 || tc.event == "invoice.voided")
				require.Equal(t, raised, res.Anomaly, "delivery %d", delivery+1)
				require.Equal(t, tc.want.status, b.status(t, inv), "delivery %d", delivery+1)

				var wantLedger, wantOutbox []string
				if tc.want.paid {
					wantLedger = []string{fmt.Sprintf("%s payment %d", inv, amount)}
					wantOutbox = []string{inv + " InvoicePaymentBooked"}
				}
				require.Equal(t, wantLedger, b.ledger(t), "delivery %d", delivery+1)
				require.Equal(t, wantOutbox, b.strings(t, "SELECT aggregate_id || ' ' || event_type FROM outbox"), "delivery %d", delivery+1)
				var wantAnomalies []string
				if tc.want.anomaly != "" {
					wantAnomalies = []string{tc.want.anomaly + " " + inv}
				}
				require.Equal(t, wantAnomalies, b.strings(t, "SELECT kind || ' ' || subject_id FROM anomalies"), "delivery %d", delivery+1)
			}
		})
	}
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// TestInvoiceFieldsFollowTheNewestSnapshot: customer and amount_due come
// from the snapshot with the latest created, whatever the order.
func TestInvoiceFieldsFollowTheNewestSnapshot(t *testing.T) {
	t.Parallel()
	b := setup(t, pgtest.DB(t))
	ctx := context.Background()
	newer := stripetest.Invoice("in_1", "cus_new", "open", 900)
	older := stripetest.Invoice("in_1", "cus_old", "draft", 100)
	for _, e := range []struct {
		typ     string
		created int64
		object  map[string]any
	}{{"invoice.finalized", 20, newer}, {"invoice.created", 10, older}} {
		payload := stripetest.EventWith("evt_"+e.typ, e.typ, stripetest.Meta{Created: e.created, Livemode: true}, e.object)
		_, err := handlers.Default().Apply(ctx, b.tx, handlers.Event{ID: "evt_" + e.typ, Type: e.typ, Endpoint: "billing", Payload: payload, Livemode: true})
		require.NoError(t, err)
	}
	var customer string
	var due int64
	require.NoError(t, b.tx.QueryRow(ctx, "SELECT customer_id, amount_due FROM invoices WHERE id = 'in_1'").Scan(&customer, &due))
	require.Equal(t, "cus_new", customer)
	require.EqualValues(t, 900, due)
	require.Equal(t, "open", b.status(t, "in_1"))
}

// TestRefundTransitions: a refund is booked once it has succeeded (whichever
// event shows it), reversed once if it then fails or is canceled, and
// never booked when it fails or is canceled before succeeding; the entries
// are the same in any order of its events, and sit under the refund's
// invoice once any event names it, else under its charge.
func TestRefundTransitions(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	// Each case's ids are made unique by replace (the cases' transactions
	// run side by side).
	const re, ch, inv = "re_X", "ch_X", "in_X"
	type ev struct {
		typ    string
		object map[string]any
	}
	refund := func(typ, status string) ev {
		return ev{typ, stripetest.RefundIn(re, ch, status, 700)}
	}
	listing := func(invoice, status string) ev {
		return ev{"charge.refunded", stripetest.ChargeWithRefundList(ch, invoice, stripetest.RefundIn(re, ch, status, 700))}
	}
	paid := ev{"invoice.paid", func() map[string]any {
		o := stripetest.Invoice(inv, "cus_1", "paid", 2000)
		o["charge"] = ch
		return o
	}()}
	booked := func(under string) []string { return []string{under + " refund:" + re + " -700"} }
	reversed := func(under string) []string {
		return []string{under + " refund:" + re + " -700", under + " refund_reversal:" + re + " 700"}
	}
	cases := []struct {
		name   string
		events []ev
		want   []string // refund entries (the payment is left out)
	}{
		{"succeeded", []ev{refund("refund.created", "succeeded")}, booked(ch)},
		{"pending is not money", []ev{refund("refund.created", "pending")}, nil},
		{"requires_action is not money", []ev{refund("refund.created", "requires_action")}, nil},
		{"pending then succeeded", []ev{refund("refund.created", "pending"), refund("refund.updated", "succeeded")}, booked(ch)},
		{"succeeded twice (two Event objects)", []ev{refund("refund.updated", "succeeded"), refund("charge.refund.updated", "succeeded")}, booked(ch)},
		{"succeeded then failed", []ev{refund("refund.created", "succeeded"), refund("refund.failed", "failed")}, reversed(ch)},
		{"failed seen before succeeded", []ev{refund("refund.failed", "failed"), refund("refund.created", "succeeded")}, reversed(ch)},
		{"succeeded then canceled", []ev{refund("refund.created", "succeeded"), refund("refund.updated", "canceled")}, reversed(ch)},
		{"pending then failed", []ev{refund("refund.created", "pending"), refund("refund.failed", "failed")}, nil},
		{"requires_action then canceled", []ev{refund("refund.created", "requires_action"), refund("refund.updated", "canceled")}, nil},
		{"a late pending changes nothing", []ev{refund("refund.updated", "succeeded"), refund("refund.created", "pending")}, booked(ch)},
		{"listed succeeded by a charge naming its invoice", []ev{listing(inv, "succeeded")}, booked(inv)},
		{"listed pending by a charge naming its invoice", []ev{listing(inv, "pending")}, nil},
		{"booked under the charge, moved to the invoice when its payment is linked", []ev{refund("refund.created", "succeeded"), paid}, booked(inv)},
		{"payment linked first", []ev{paid, refund("refund.created", "succeeded")}, booked(inv)},
		{"reversal moved with its refund", []ev{refund("refund.created", "succeeded"), refund("refund.failed", "failed"), listing(inv, "failed")}, reversed(inv)},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, db)
			own := func(s string) string { return strings.ReplaceAll(s, "_X", fmt.Sprintf("_%02d", i)) }
			for _, e := range tc.events {
				object, err := json.Marshal(e.object)
				require.NoError(t, err)
				var mine map[string]any
				require.NoError(t, json.Unmarshal([]byte(own(string(object))), &mine))
				require.Equal(t, handlers.Applied, b.apply(t, e.typ, mine).Outcome)
			}
			got := slices.DeleteFunc(b.ledger(t), func(s string) bool { return s == own(inv+" payment 2000") })
			var want []string
			for _, w := range tc.want {
				want = append(want, own(w))
			}
			require.Equal(t, want, got)
		})
	}
}

// TestBadPayloadsAndUnknownTypes: a payload a handler cannot use is
// ErrBadPayload (retrying cannot help), and books nothing; an event type
// without a handler is Ignored.
func TestBadPayloadsAndUnknownTypes(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	for name, tc := range map[string]struct {
		typ    string
		object map[string]any
	}{
		"invoice without id":         {"invoice.paid", map[string]any{"object": "invoice", "status": "paid"}},
		"refund without id":          {"refund.created", map[string]any{"object": "refund", "status": "succeeded", "amount": 5, "charge": "ch_1"}},
		"refund of unknown status":   {"refund.updated", stripetest.RefundIn("re_1", "ch_1", "reversed", 5)},
		"refund of no amount":        {"refund.updated", stripetest.RefundIn("re_1", "ch_1", "succeeded", 0)},
		"charge without id":          {"charge.refunded", map[string]any{"object": "charge"}},
		"listed refund of no status": {"charge.refunded", stripetest.ChargeWithRefundList("ch_1", "in_1", map[string]any{"id": "re_1", "amount": 5})},
		"invoice payment of nothing": {"invoice_payment.paid", map[string]any{"object": "invoice_payment"}},
		"dispute without a charge":   {"charge.dispute.funds_withdrawn", stripetest.Dispute("dp_1", "", "", "needs_response", 5)},
		"dispute of unknown status":  {"charge.dispute.funds_withdrawn", stripetest.Dispute("dp_1", "ch_1", "", "charge_refunded", 5)},
		"dispute withdrawn twice": {"charge.dispute.funds_withdrawn", stripetest.Dispute("dp_1", "ch_1", "", "needs_response", 5,
			stripetest.DisputeBalanceTransaction("txn_1", -5, 0, "usd"), stripetest.DisputeBalanceTransaction("txn_2", -5, 0, "usd"))},
		"out of band beyond the paid amount": {"invoice.paid", func() map[string]any {
			o := stripetest.Invoice("in_1", "cus_1", "paid", 100)
			o["amount_paid_off_stripe"] = 101
			return o
		}()},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, db)
			_, err := b.applyErr(tc.typ, tc.object)
			require.ErrorIs(t, err, handlers.ErrBadPayload)
			require.Empty(t, b.ledger(t))
		})
	}
	t.Run("unknown type", func(t *testing.T) {
		t.Parallel()
		b := setup(t, db)
		res := b.apply(t, "customer.created", map[string]any{"id": "cus_1", "object": "customer"})
		require.Equal(t, handlers.Ignored, res.Outcome)
	})
}
