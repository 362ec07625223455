package handlers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/stripetest"
)

// The rest of the money (issue 23): disputes, payments outside Stripe, a
// void after a payment, and connected accounts, each on a real database.

// sent is one event as a test sends it: its type, object, API version and
// connected account ("" the platform).
type sent struct {
	typ     string
	object  map[string]any
	version string
	account string
}

// send applies ev as a new Event object (an id of its own), as the worker
// would.
func (b *testBundle) send(t *testing.T, ev sent) handlers.Result {
	t.Helper()
	b.seq++
	id := fmt.Sprintf("evt_%d", b.seq)
	var m map[string]any
	require.NoError(t, json.Unmarshal(stripetest.EventWith(id, ev.typ, stripetest.Meta{Created: stripetest.Created + int64(b.seq), Livemode: true, Account: ev.account}, ev.object), &m))
	if ev.version != "" {
		m["api_version"] = ev.version
	}
	payload, err := json.Marshal(m)
	require.NoError(t, err)
	res, err := handlers.Default().Apply(context.Background(), b.tx, handlers.Event{
		ID: id, Type: ev.typ, Endpoint: "billing", Payload: payload, Livemode: true, Account: ev.account,
	})
	require.NoError(t, err, "%s %s", ev.typ, payload)
	require.Equal(t, handlers.Applied, res.Outcome)
	return res
}

// outbox is every outbox row as "aggregate_id event_type amount", sorted.
func (b *testBundle) outbox(t *testing.T) []string {
	return b.strings(t, "SELECT aggregate_id || ' ' || event_type || ' ' || (payload->>'amount') FROM outbox")
}

// renamed returns o with every "_X" in its JSON replaced by suffix, so that
// parallel cases use ids of their own.
func renamed(t *testing.T, o map[string]any, suffix string) map[string]any {
	t.Helper()
	b, err := json.Marshal(o)
	require.NoError(t, err)
	var out map[string]any
	require.NoError(t, json.Unmarshal([]byte(strings.ReplaceAll(string(b), "_X", suffix)), &out))
	return out
}

// TestDisputes: a dispute lost and won, in the shape before basil (the
// invoice names its charge) and from basil on (invoice_payment.paid names
// the PaymentIntent), with and without balance transactions, every event
// sent twice (two Event objects), in Stripe's order and reversed. The
// ledger ends the same: the payment, the withdrawal once (negative), the
// reinstatement once when won (positive), under the invoice; one outbox row
// per movement; the dispute's final status; the fee is not booked.
func TestDisputes(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	const inv, ch, pi, dp = "in_X", "ch_X", "pi_X", "dp_X"
	paidInvoice := func(withCharge bool) map[string]any {
		o := stripetest.Invoice(inv, "cus_1", "paid", 1000)
		if withCharge {
			o["charge"], o["payment_intent"], o["paid"], o["paid_out_of_band"] = ch, pi, true, false
		}
		return o
	}
	shapes := []struct {
		name, version string
		events        []sent
	}{
		{"pre-basil", "2024-06-20", []sent{{typ: "invoice.paid", object: paidInvoice(true)}}},
		{"basil", "2025-03-31.basil", []sent{
			{typ: "invoice.paid", object: paidInvoice(false)},
			{typ: "invoice_payment.paid", object: map[string]any{"id": "inpay_X", "object": "invoice_payment", "invoice": inv, "status": "paid",
				"amount_paid": 1000, "currency": "usd", "payment": map[string]any{"type": "payment_intent", "payment_intent": pi}}},
		}},
	}
	withdrawBT := stripetest.DisputeBalanceTransaction("txn_w_X", -920, 1500, "eur")
	reinstateBT := stripetest.DisputeBalanceTransaction("txn_r_X", 920, 0, "eur")
	n := 0
	for _, sh := range shapes {
		for _, outcome := range []string{"lost", "won"} {
			for _, bts := range []bool{false, true} {
				for _, reversed := range []bool{false, true} {
					n++
					name := fmt.Sprintf("%s/%s/balance_transactions=%v/reversed=%v", sh.name, outcome, bts, reversed)
					suffix := fmt.Sprintf("_%02d", n)
					t.Run(name, func(t *testing.T) {
						t.Parallel()
						b := setup(t, db)
						dispute := func(status string, withBTs ...map[string]any) map[string]any {
							if !bts {
								withBTs = nil
							}
							return stripetest.Dispute(dp, ch, pi, status, 1000, withBTs...)
						}
						events := slices.Clone(sh.events)
						events = append(events,
							sent{typ: "charge.dispute.created", object: dispute("needs_response")},
							sent{typ: "charge.dispute.funds_withdrawn", object: dispute("needs_response", withdrawBT)},
							sent{typ: "charge.dispute.updated", object: dispute("under_review", withdrawBT)},
						)
						if outcome == "won" {
							events = append(events, sent{typ: "charge.dispute.funds_reinstated", object: dispute("won", withdrawBT, reinstateBT)})
						}
						events = append(events, sent{typ: "charge.dispute.closed", object: dispute(outcome, withdrawBT, reinstateBT)})
						if reversed {
							slices.Reverse(events)
						}
						for _, ev := range events {
							ev.version, ev.object = sh.version, renamed(t, ev.object, suffix)
							for range 2 {
								b.send(t, ev)
							}
						}
						own := func(s string) string { return strings.ReplaceAll(s, "_X", suffix) }
						withdrawn, reinstated := "-1000", "1000"
						if bts {
							withdrawn, reinstated = "-920", "920" // the balance's amount (eur), not the dispute's
						}
						want := []string{own(inv + " payment 1000"), own(inv+" dispute_funds_withdrawn:"+dp+" ") + withdrawn}
						wantOutbox := []string{own(inv + " InvoicePaymentBooked 1000"), own(dp+" DisputeFundsWithdrawn ") + withdrawn}
						if outcome == "won" {
							want = append(want, own(inv+" dispute_funds_reinstated:"+dp+" ")+reinstated)
							wantOutbox = append(wantOutbox, own(dp+" DisputeFundsReinstated ")+reinstated)
						}
						slices.Sort(want)
						slices.Sort(wantOutbox)
						require.Equal(t, want, b.ledger(t))
						require.Equal(t, wantOutbox, b.outbox(t))
						require.Equal(t, []string{outcome}, b.strings(t, "SELECT status FROM disputes WHERE id = $1", own(dp)))
						if bts {
							require.Equal(t, []string{"eur"}, b.strings(t, "SELECT DISTINCT currency FROM ledger_entries WHERE kind LIKE 'dispute%'"))
						}
						require.Empty(t, b.strings(t, "SELECT kind FROM anomalies"))
					})
				}
			}
		}
	}
}

// TestDisputeBeforeTheLinkingPayment: a dispute withdrawn before any event
// has linked its payment to an invoice is booked under its charge (pre-basil)
// or its PaymentIntent (basil, the dispute naming only it and its charge),
// and moves to the invoice when the invoice payment links it, without a
// second outbox row.
func TestDisputeBeforeTheLinkingPayment(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	for i, link := range []sent{
		{typ: "charge.refunded", version: "2024-06-20", object: stripetest.ChargeWithRefundList("ch_X", "in_X")},
		{typ: "invoice_payment.paid", version: "2025-03-31.basil", object: map[string]any{"id": "inpay_X", "object": "invoice_payment", "invoice": "in_X",
			"status": "paid", "amount_paid": 1000, "currency": "usd", "payment": map[string]any{"type": "payment_intent", "payment_intent": "pi_X"}}},
	} {
		t.Run(link.typ, func(t *testing.T) {
			t.Parallel()
			b := setup(t, db)
			suffix := fmt.Sprintf("_%02d", i)
			own := func(s string) string { return strings.ReplaceAll(s, "_X", suffix) }
			b.send(t, sent{typ: "charge.dispute.funds_withdrawn", version: link.version, object: renamed(t, stripetest.Dispute("dp_X", "ch_X", "pi_X", "needs_response", 700), suffix)})
			require.Equal(t, []string{own("ch_X dispute_funds_withdrawn:dp_X -700")}, b.ledger(t), "under the charge until linked")
			link.object = renamed(t, link.object, suffix)
			b.send(t, link)
			require.Equal(t, []string{own("in_X dispute_funds_withdrawn:dp_X -700")}, b.ledger(t), "moved to the invoice")
			require.Equal(t, []string{own("dp_X DisputeFundsWithdrawn -700")}, b.outbox(t))
			require.Equal(t, []string{own("in_X")}, b.strings(t, "SELECT invoice_id FROM disputes"))
		})
	}
}

// TestDisputeStatusOnlyBooksNothing: created, updated and closed record the
// status, whatever their order, and book nothing; an inquiry that closes
// books nothing.
func TestDisputeStatusOnlyBooksNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, pgtest.DB(t))
	for _, e := range []struct{ typ, status string }{
		{"charge.dispute.closed", "warning_closed"}, {"charge.dispute.created", "warning_needs_response"}, {"charge.dispute.updated", "warning_under_review"},
	} {
		b.send(t, sent{typ: e.typ, object: stripetest.Dispute("dp_inq", "ch_inq", "", e.status, 500)})
	}
	require.Empty(t, b.ledger(t))
	require.Empty(t, b.outbox(t))
	require.Equal(t, []string{"warning_closed"}, b.strings(t, "SELECT status FROM disputes"))
}

// TestOutOfBandPayments: an invoice paid outside Stripe, in each shape that
// says so, becomes paid and books 'paid_out_of_band' (with one
// InvoicePaidOutOfBand row), never a 'payment' for money Stripe did not
// move; each event twice. From clover on, an invoice_payment.paid of type
// payment_record with money in it raises out_of_band_payment (the
// invoice.paid of those versions cannot tell it apart), in either order.
func TestOutOfBandPayments(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	paid := func(change func(o map[string]any)) map[string]any {
		o := stripetest.Invoice("in_X", "cus_1", "paid", 1000)
		change(o)
		return o
	}
	record := func(amount int64) map[string]any {
		return map[string]any{"id": "inpay_X", "object": "invoice_payment", "invoice": "in_X", "status": "paid", "amount_paid": amount, "currency": "usd",
			"payment": map[string]any{"type": "payment_record", "payment_record": "pr_X"}}
	}
	cases := []struct {
		name    string
		events  []sent
		ledger  []string
		outbox  []string
		anomaly []string
	}{
		{"pre-basil paid_out_of_band", []sent{{typ: "invoice.paid", version: "2024-06-20", object: paid(func(o map[string]any) {
			o["paid_out_of_band"], o["charge"], o["paid"] = true, nil, true
		})}}, []string{"in_X paid_out_of_band 1000"}, []string{"in_X InvoicePaidOutOfBand 1000"}, nil},
		{"pre-basil paid by card", []sent{{typ: "invoice.paid", version: "2024-06-20", object: paid(func(o map[string]any) {
			o["paid_out_of_band"], o["charge"], o["paid"] = false, "ch_X", true
		})}}, []string{"in_X payment 1000"}, []string{"in_X InvoicePaymentBooked 1000"}, nil},
		{"dahlia amount_paid_off_stripe, part outside", []sent{{typ: "invoice.paid", version: "2026-05-27.dahlia", object: paid(func(o map[string]any) {
			o["amount_paid_off_stripe"] = 400
		})}}, []string{"in_X paid_out_of_band 400", "in_X payment 600"}, []string{"in_X InvoicePaidOutOfBand 400", "in_X InvoicePaymentBooked 600"}, nil},
		{"dahlia amount_paid_off_stripe, all outside", []sent{{typ: "invoice.paid", version: "2026-05-27.dahlia", object: paid(func(o map[string]any) {
			o["amount_paid_off_stripe"] = 1000
		})}}, []string{"in_X paid_out_of_band 1000"}, []string{"in_X InvoicePaidOutOfBand 1000"}, nil},
		{"clover payments list with a payment record", []sent{{typ: "invoice.paid", version: "2025-10-29.clover", object: paid(func(o map[string]any) {
			o["payments"] = map[string]any{"object": "list", "data": []any{record(1000)}}
		})}}, []string{"in_X paid_out_of_band 1000"}, []string{"in_X InvoicePaidOutOfBand 1000"}, nil},
		{"clover invoice_payment.paid payment_record after invoice.paid", []sent{
			{typ: "invoice.paid", version: "2025-10-29.clover", object: paid(func(map[string]any) {})},
			{typ: "invoice_payment.paid", version: "2025-10-29.clover", object: record(1000)},
		}, []string{"in_X payment 1000"}, []string{"in_X InvoicePaymentBooked 1000"}, []string{"out_of_band_payment in_X"}},
		{"clover invoice_payment.paid payment_record before invoice.paid", []sent{
			{typ: "invoice_payment.paid", version: "2025-10-29.clover", object: record(1000)},
			{typ: "invoice.paid", version: "2025-10-29.clover", object: paid(func(map[string]any) {})},
		}, []string{"in_X payment 1000"}, []string{"in_X InvoicePaymentBooked 1000"}, []string{"out_of_band_payment in_X"}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, db)
			suffix := fmt.Sprintf("_%02d", i)
			own := func(ss []string) []string {
				var out []string
				for _, s := range ss {
					out = append(out, strings.ReplaceAll(s, "_X", suffix))
				}
				return out
			}
			for _, ev := range tc.events {
				ev.object = renamed(t, ev.object, suffix)
				for range 2 {
					b.send(t, ev)
				}
			}
			require.Equal(t, "paid", b.status(t, "in"+suffix))
			require.Equal(t, own(tc.ledger), b.ledger(t))
			require.Equal(t, own(tc.outbox), b.outbox(t))
			require.Equal(t, own(tc.anomaly), b.strings(t, "SELECT kind || ' ' || subject_id FROM anomalies"))
		})
	}
}

// TestVoidAndPaymentReachAHumanInEitherOrder: a payment and a void of one
// invoice end the same whichever is processed first, each event sent twice
// (two Event objects): the invoice paid with the payment's amount, the
// payment booked once with one outbox row, and one anomaly whose detail
// says which came first. In the basil shape (invoice.payments names the
// PaymentIntent) with part of it paid outside Stripe, and a refund of the
// PaymentIntent booked before either, the split and the refund's move to
// the invoice are those of a payment on an open invoice.
func TestVoidAndPaymentReachAHumanInEitherOrder(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	type shape struct {
		name   string
		paid   func(inv string) map[string]any
		before []sent // sent before the payment and the void
		ledger []string
		outbox []string
	}
	shapes := []shape{
		{"card", func(inv string) map[string]any { return stripetest.Invoice(inv, "cus_1", "paid", 1200) }, nil,
			[]string{"in_X payment 1200"}, []string{"in_X InvoicePaymentBooked 1200"}},
		{"basil, part outside Stripe, refunded before", func(inv string) map[string]any {
			o := stripetest.Invoice(inv, "cus_1", "paid", 1200)
			o["payments"] = map[string]any{"object": "list", "data": []any{
				map[string]any{"id": "inpay_X", "object": "invoice_payment", "invoice": inv, "status": "paid", "amount_paid": 800, "currency": "usd",
					"payment": map[string]any{"type": "payment_intent", "payment_intent": "pi_X"}},
				map[string]any{"id": "inpay_rX", "object": "invoice_payment", "invoice": inv, "status": "paid", "amount_paid": 400, "currency": "usd",
					"payment": map[string]any{"type": "payment_record", "payment_record": "pr_X"}},
			}}
			return o
		}, []sent{{typ: "refund.created", object: map[string]any{"id": "re_X", "object": "refund", "status": "succeeded", "amount": 300,
			"currency": "usd", "charge": "ch_X", "payment_intent": "pi_X"}}},
			[]string{"in_X paid_out_of_band 400", "in_X payment 800", "in_X refund:re_X -300"},
			[]string{"in_X InvoicePaidOutOfBand 400", "in_X InvoicePaymentBooked 800"}},
	}
	n := 0
	for _, sh := range shapes {
		for _, order := range [][]string{{"paid", "void"}, {"void", "paid"}} {
			n++
			suffix := fmt.Sprintf("_pv%02d", n)
			t.Run(sh.name+"/"+strings.Join(order, " then "), func(t *testing.T) {
				t.Parallel()
				b := setup(t, db)
				own := func(ss []string) []string {
					var out []string
					for _, s := range ss {
						out = append(out, strings.ReplaceAll(s, "_X", suffix))
					}
					return out
				}
				inv := "in" + suffix
				for _, ev := range sh.before {
					ev.object = renamed(t, ev.object, suffix)
					b.send(t, ev)
				}
				for _, status := range order {
					object := stripetest.Invoice(inv, "cus_1", "void", 1200)
					if status == "paid" {
						object = renamed(t, sh.paid("in_X"), suffix)
					}
					for range 2 {
						b.send(t, sent{typ: invoiceEvent[status], object: object, version: "2025-03-31.basil"})
					}
				}
				require.Equal(t, []string{"paid 1200"}, b.strings(t, "SELECT status || ' ' || amount_paid FROM invoices"))
				require.Equal(t, own(sh.ledger), b.ledger(t))
				require.Equal(t, own(sh.outbox), b.outbox(t))
				require.Equal(t, []string{"payment_on_void_invoice " + inv + " " + order[0]},
					b.strings(t, "SELECT kind || ' ' || subject_id || ' ' || (detail->>'first') FROM anomalies"))
			})
		}
	}
}

// TestConnectedAccountsWithCollidingIDs: two connected accounts and the
// platform tell the same story with the same object ids (invoice, charge,
// refund, dispute). Each books its own entries, with its account; no key is
// shared, no refund or dispute moves to another's invoice, and every outbox
// row carries its account.
func TestConnectedAccountsWithCollidingIDs(t *testing.T) {
	t.Parallel()
	b := setup(t, pgtest.DB(t))
	accounts := []string{"acct_A", "acct_B", ""}
	for i, acct := range accounts {
		amount := int64(1000 * (i + 1))
		paidInv := stripetest.Invoice("in_same", "cus_1", "paid", amount)
		paidInv["charge"] = "ch_same"
		for _, ev := range []sent{
			{typ: "charge.dispute.funds_withdrawn", object: stripetest.Dispute("dp_same", "ch_same", "", "needs_response", amount/2)},
			{typ: "refund.created", object: stripetest.RefundIn("re_same", "ch_same", "succeeded", amount/4)},
			{typ: "invoice.paid", object: paidInv, version: "2024-06-20"},
		} {
			ev.account = acct
			b.send(t, ev)
		}
	}
	require.Equal(t, []string{
		"- in_same dispute_funds_withdrawn:dp_same -1500", "- in_same payment 3000", "- in_same refund:re_same -750",
		"acct_A in_same dispute_funds_withdrawn:dp_same -500", "acct_A in_same payment 1000", "acct_A in_same refund:re_same -250",
		"acct_B in_same dispute_funds_withdrawn:dp_same -1000", "acct_B in_same payment 2000", "acct_B in_same refund:re_same -500",
	}, b.strings(t, "SELECT coalesce(account, '-') || ' ' || invoice_id || ' ' || kind || ' ' || amount FROM ledger_entries"))
	require.Equal(t, []string{"- paid 3000", "acct_A paid 1000", "acct_B paid 2000"},
		b.strings(t, "SELECT coalesce(account, '-') || ' ' || status || ' ' || amount_paid FROM invoices"))
	require.Equal(t, []string{
		"- DisputeFundsWithdrawn -1500", "- InvoicePaymentBooked 3000",
		"acct_A DisputeFundsWithdrawn -500", "acct_A InvoicePaymentBooked 1000",
		"acct_B DisputeFundsWithdrawn -1000", "acct_B InvoicePaymentBooked 2000",
	}, b.strings(t, "SELECT coalesce(payload->>'account', '-') || ' ' || event_type || ' ' || (payload->>'amount') FROM outbox"))
	require.Equal(t, 3, len(b.strings(t, "SELECT id FROM refunds")))
	require.Equal(t, 3, len(b.strings(t, "SELECT id FROM disputes")))
}

// TestChargeRefundedAppliesEveryListedRefund: a charge.refunded lists
// several refunds (in no particular order, one of them twice in two
// statuses), before its invoice is known and again after. Each refund is
// merged once into its row and booked by what the row calls for: the
// succeeded ones once each (one of them listed first as pending), the
// pending one not, the one that succeeded and then failed booked and
// reversed; all under the charge until a later event links it, then under
// the invoice.
func TestChargeRefundedAppliesEveryListedRefund(t *testing.T) {
	t.Parallel()
	b := setup(t, pgtest.DB(t))
	list := []map[string]any{
		stripetest.RefundIn("re_c", "ch_L", "pending", 300),
		stripetest.RefundIn("re_a", "ch_L", "succeeded", 100),
		stripetest.RefundIn("re_d", "ch_L", "succeeded", 400),
		stripetest.RefundIn("re_c", "ch_L", "succeeded", 300),
		stripetest.RefundIn("re_b", "ch_L", "pending", 200),
	}
	b.send(t, sent{typ: "charge.refunded", version: "2025-03-31.basil", object: stripetest.ChargeWithRefundList("ch_L", "", list...)})
	require.Equal(t, []string{"ch_L refund:re_a -100", "ch_L refund:re_c -300", "ch_L refund:re_d -400"}, b.ledger(t))
	b.send(t, sent{typ: "refund.failed", object: stripetest.RefundIn("re_d", "ch_L", "failed", 400)})
	b.send(t, sent{typ: "charge.refunded", version: "2024-06-20", object: stripetest.ChargeWithRefundList("ch_L", "in_L", list[1:3]...)})
	require.Equal(t, []string{"in_L refund:re_a -100", "in_L refund:re_c -300", "in_L refund:re_d -400", "in_L refund_reversal:re_d 400"}, b.ledger(t))
	require.Equal(t, []string{"re_a succeeded in_L", "re_b pending in_L", "re_c succeeded in_L", "re_d failed in_L"},
		b.strings(t, "SELECT id || ' ' || status || ' ' || invoice_id FROM refunds"))
}

// TestARefundAndADisputeBeforeTheLink: a refund (succeeded, then failed)
// and a dispute's withdrawal of one charge are booked under the charge
// before any event links it; the invoice.paid that names the charge moves
// all three entries to the invoice in one statement (attributeRefunds),
// books the payment, and queues the dispute's outbox row once.
func TestARefundAndADisputeBeforeTheLink(t *testing.T) {
	t.Parallel()
	b := setup(t, pgtest.DB(t))
	b.send(t, sent{typ: "refund.created", object: stripetest.RefundIn("re_RD", "ch_RD", "succeeded", 300)})
	b.send(t, sent{typ: "refund.failed", object: stripetest.RefundIn("re_RD", "ch_RD", "failed", 300)})
	b.send(t, sent{typ: "charge.dispute.funds_withdrawn", object: stripetest.Dispute("dp_RD", "ch_RD", "", "needs_response", 700)})
	require.Equal(t, []string{"ch_RD dispute_funds_withdrawn:dp_RD -700", "ch_RD refund:re_RD -300", "ch_RD refund_reversal:re_RD 300"}, b.ledger(t))
	paid := stripetest.Invoice("in_RD", "cus_1", "paid", 1000)
	paid["charge"], paid["paid"], paid["paid_out_of_band"] = "ch_RD", true, false
	b.send(t, sent{typ: "invoice.paid", version: "2024-06-20", object: paid})
	require.Equal(t, []string{"in_RD dispute_funds_withdrawn:dp_RD -700", "in_RD payment 1000", "in_RD refund:re_RD -300", "in_RD refund_reversal:re_RD 300"}, b.ledger(t))
	require.Equal(t, []string{"dp_RD DisputeFundsWithdrawn -700", "in_RD InvoicePaymentBooked 1000"}, b.outbox(t))
	require.Equal(t, []string{"in_RD", "in_RD"}, b.strings(t, "SELECT invoice_id FROM refunds UNION ALL SELECT invoice_id FROM disputes"))
}

// TestTheInvoicePaidOutboxRowHoldsTheBooking: the outbox row of a payment
// names the invoice, its customer, the amount, the currency, the event and
// the connected account (null on the platform), and nothing else.
func TestTheInvoicePaidOutboxRowHoldsTheBooking(t *testing.T) {
	b := setup(t, pgtest.DB(t))
	b.send(t, sent{typ: "invoice.paid", object: stripetest.Invoice("in_p", "cus_p", "paid", 1200)})
	b.send(t, sent{typ: "invoice.paid", object: stripetest.Invoice("in_c", "cus_c", "paid", 800), account: "acct_C"})
	require.Equal(t, []string{
		`{"amount": 1200, "account": null, "currency": "usd", "event_id": "evt_1", "invoice_id": "in_p", "customer_id": "cus_p"}`,
		`{"amount": 800, "account": "acct_C", "currency": "usd", "event_id": "evt_2", "invoice_id": "in_c", "customer_id": "cus_c"}`,
	}, b.strings(t, "SELECT payload::text FROM outbox WHERE event_type = 'InvoicePaymentBooked' ORDER BY id"))
}
