package handlers

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// Refunds are booked only once they have succeeded, and reversed once if
// they fail after that.
//
// Every event that shows a refund (refund.created, refund.updated,
// refund.failed, the older charge.refund.updated, and each refund listed by
// charge.refunded, which lists failed and canceled ones too) is an
// observation of its status. The refunds table merges them in a way that
// does not depend on their order: the highest-ranked status seen (pending,
// requires_action < succeeded < failed, canceled; a refund never goes back),
// and whether any of them showed it succeeded. The ledger entries are a
// function of that row:
//
//	'refund:<id>'          -amount   if some event showed it succeeded
//	'refund_reversal:<id>' +amount   if so, and its highest status is failed or canceled
//
// That is the choice for a refund that went succeeded -> failed: it is
// booked and reversed (two entries, net zero) whether the succeeded or the
// failed event is processed first, so the same events give the same rows in
// any order. (Basing the entries on the highest status alone would leave no
// entries when the failure comes first and two when it comes last.) A refund
// that went pending -> failed, or pending -> canceled, books nothing. The
// original entry's amount is never updated: a failure adds its own entry,
// under its own unique key.
//
// A refund's entries are both booked under one key, recorded on its row
// (refunds.booked_under): its invoice once any event has told it (a link of
// its charge or PaymentIntent to the invoice, payment_links, whether that
// event is the refund's own or the link's), else its charge, else its
// PaymentIntent, else its own id. The statement that changes the key books
// and moves the entries under the new one (refundEntries in queries.go:
// an UPDATE of invoice_id only, never of an amount), so a refund and its
// reversal are never split across keys, and a refund always ends attributed
// to its invoice, whatever order the events come in. Once known, the
// invoice never changes.

// refund is the part of a Stripe Refund the handlers read; contract says
// how (see contract.go).
type refund struct {
	ID            Str `json:"id"`
	Amount        Int `json:"amount"`
	Currency      Str `json:"currency"`
	Charge        ID  `json:"charge"`         // an id, an expanded Charge, or null
	PaymentIntent ID  `json:"payment_intent"` // an id, an expanded PaymentIntent, or null
	Status        Str `json:"status"`
}

// refundStatuses are the statuses Stripe documents for a refund.
var refundStatuses = []string{"pending", "requires_action", "succeeded", "failed", "canceled"}

func (r *refund) contract(c *checker) {
	c.want("id", r.ID.Kind, String)
	c.nonEmpty("id", r.ID.Kind, r.ID.V)
	c.want("amount", r.Amount.Kind, Integer)
	c.positive("amount", r.Amount)
	c.want("currency", r.Currency.Kind, String)
	c.want("charge", r.Charge.Kind, Ref|Null|Absent)
	c.want("payment_intent", r.PaymentIntent.Kind, Ref|Null|Absent)
	c.want("status", r.Status.Kind, String)
	c.oneOf("status", r.Status, refundStatuses...)
}

// charge is the part of a Stripe Charge the handlers read.
type charge struct {
	ID            Str `json:"id"`
	Invoice       ID  `json:"invoice"` // an id, an expanded Invoice, null, or absent (2025-03-31.basil and later)
	PaymentIntent ID  `json:"payment_intent"`
	Currency      Str `json:"currency"`
	// The refunds, when the payload includes them (since 2022-11-15 only
	// when expanded).
	Refunds *struct {
		Data []refund `json:"data"`
	} `json:"refunds"`
}

func (ch *charge) contract(c *checker) {
	c.want("id", ch.ID.Kind, String)
	c.nonEmpty("id", ch.ID.Kind, ch.ID.V)
	c.want("invoice", ch.Invoice.Kind, Ref|Null|Absent) // removed in basil
	c.want("payment_intent", ch.PaymentIntent.Kind, Ref|Null|Absent)
	c.want("currency", ch.Currency.Kind, String)
	if ch.Refunds != nil {
		for i := range ch.Refunds.Data {
			c.in(fmt.Sprintf("refunds.data[%d]", i), ch.Refunds.Data[i].contract)
		}
	}
}

// paymentIDs returns the non-empty ids, sorted and without duplicates.
func paymentIDs(ids ...string) []string {
	ids = slices.DeleteFunc(ids, func(s string) bool { return s == "" })
	slices.Sort(ids)
	return slices.Compact(ids)
}

// charge.refunded: record the charge's invoice when the charge names it
// (API versions before 2025-03-31.basil), then apply every refund in the
// charge's refund list, whatever its status, in one statement (see
// applyRefunds).
//
// Since API version 2022-11-15 a charge no longer carries its refunds unless
// expanded. Such an event books nothing here; subscribe the endpoint to
// refund.created, refund.updated and refund.failed as well, which carry each
// refund (see README).
func chargeRefunded(ctx context.Context, tx DB, ev Event, ch charge, _ Meta) (Result, error) {
	var refunds []refund
	if ch.Refunds != nil {
		refunds = slices.Clone(ch.Refunds.Data)
	}
	// The link first: applyRefunds takes the link rows before the refunds'.
	if ch.Invoice.V != "" {
		if err := link(ctx, tx, ev, ch.Invoice.V, paymentIDs(ch.ID.V, ch.PaymentIntent.V)); err != nil {
			return Result{}, err
		}
	}
	for i := range refunds {
		if refunds[i].Charge.V == "" {
			refunds[i].Charge.V = ch.ID.V
		}
		if refunds[i].PaymentIntent.V == "" {
			refunds[i].PaymentIntent.V = ch.PaymentIntent.V
		}
	}
	return Result{Outcome: Applied}, applyRefundsOf(ctx, tx, ev, refunds)
}

// refund.created, refund.updated, refund.failed and charge.refund.updated:
// apply the refund (see applyRefundsOf).
func refundChanged(ctx context.Context, tx DB, ev Event, r refund, _ Meta) (Result, error) {
	return Result{Outcome: Applied}, applyRefundsOf(ctx, tx, ev, []refund{r})
}

// applyRefundsOf merges these observations of refunds into their rows and
// books what the rows call for (applyRefunds), in id order so that two
// events showing the same refunds lock them in the same order: in one
// statement, unless a refund is listed twice (a statement changes a row
// once), when each goes in a statement of its own.
func applyRefundsOf(ctx context.Context, tx DB, ev Event, refunds []refund) error {
	if len(refunds) == 0 {
		return nil
	}
	refunds = slices.SortedFunc(slices.Values(refunds), func(a, b refund) int { return strings.Compare(a.ID.V, b.ID.V) })
	listedTwice := false
	for i := 1; i < len(refunds); i++ {
		listedTwice = listedTwice || refunds[i].ID.V == refunds[i-1].ID.V
	}
	if listedTwice {
		for _, r := range refunds {
			if err := applyRefundsOf(ctx, tx, ev, []refund{r}); err != nil {
				return err
			}
		}
		return nil
	}
	n := len(refunds)
	ids, charges, intents := make([]string, n), make([]*string, n), make([]*string, n)
	amounts, currencies, statuses := make([]int64, n), make([]*string, n), make([]string, n)
	var payments []string
	for i, r := range refunds {
		ids[i], charges[i], intents[i] = r.ID.V, nullIfEmpty(r.Charge.V), nullIfEmpty(r.PaymentIntent.V)
		amounts[i], currencies[i], statuses[i] = r.Amount.V, nullIfEmpty(r.Currency.V), r.Status.V
		payments = append(payments, r.Charge.V, r.PaymentIntent.V)
	}
	if _, err := tx.Exec(ctx, applyRefunds, ids, charges, intents, amounts, currencies, statuses, ev.ID,
		paymentIDs(payments...), account(ev)); err != nil {
		if n == 1 {
			return fmt.Errorf("applying refund %s (%s): %w", ids[0], statuses[0], err)
		}
		return fmt.Errorf("applying refunds %v: %w", ids, err)
	}
	return nil
}

// invoice_payment.paid (2025-03-31.basil and later): record which charge or
// PaymentIntent paid the invoice. The payment itself is booked by
// invoice.paid. A payment of type payment_record (2025-10-29.clover and
// later) is money paid outside Stripe: it links nothing and books nothing
// (no Stripe charge can be refunded or disputed). When it holds money, it
// raises the anomaly out_of_band_payment for a human: from basil on,
// invoice.paid's amount_paid counts it, and unless that event's payload
// split it out (amount_paid_off_stripe, or the payments list; see
// invoice.split), the invoice's 'payment' entry holds it too. Raised
// whichever event is processed first, once per invoice.
func invoicePaymentPaid(ctx context.Context, tx DB, ev Event, p invoicePayment, _ Meta) (Result, error) {
	if err := link(ctx, tx, ev, p.Invoice.V, paymentIDs(p.Payment.stripePayments()...)); err != nil {
		return Result{}, err
	}
	amount := p.outsideStripe()
	if amount == 0 {
		return Result{Outcome: Applied}, nil
	}
	detail, _ := json.Marshal(map[string]any{"payment_record": p.Payment.PaymentRecord.V, "amount_paid": amount, "currency": p.Currency.V})
	if _, err := tx.Exec(ctx, raiseAnomaly, "out_of_band_payment", p.Invoice.V, ev.Endpoint, ev.ID, string(detail), account(ev)); err != nil {
		return Result{}, fmt.Errorf("recording anomaly for invoice %s: %w", p.Invoice.V, err)
	}
	return Result{Outcome: Applied, Anomaly: true}, nil
}
