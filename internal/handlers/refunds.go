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

// refund is the part of a Stripe Refund the handlers read.
type refund struct {
	ID            string `json:"id"`
	Amount        int64  `json:"amount"`
	Currency      string `json:"currency"`
	Charge        any    `json:"charge"`         // an id, or an expanded Charge
	PaymentIntent any    `json:"payment_intent"` // an id, an expanded PaymentIntent, or null
	Status        string `json:"status"`
}

// refundStatuses are the statuses Stripe documents for a refund.
var refundStatuses = []string{"pending", "requires_action", "succeeded", "failed", "canceled"}

// charge is the part of a Stripe Charge the handlers read.
type charge struct {
	ID            string `json:"id"`
	Invoice       any    `json:"invoice"` // an id, an expanded Invoice, or absent (2025-03-31.basil and later)
	PaymentIntent any    `json:"payment_intent"`
	Currency      string `json:"currency"`
	Refunds       *struct {
		Data []refund `json:"data"`
	} `json:"refunds"`
}

// idOf returns the id of a field that is either an id string or an expanded
// object with an id.
func idOf(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case map[string]any:
		if id, ok := x["id"].(string); ok {
			return id
		}
	}
	return ""
}

// paymentIDs returns the non-empty ids, sorted and without duplicates.
func paymentIDs(ids ...string) []string {
	ids = slices.DeleteFunc(ids, func(s string) bool { return s == "" })
	slices.Sort(ids)
	return slices.Compact(ids)
}

// charge.refunded: record the charge's invoice when the charge names it
// (API versions before 2025-03-31.basil), then apply each refund in the
// charge's refund list, whatever its status (see applyRefundTo).
//
// Since API version 2022-11-15 a charge no longer carries its refunds unless
// expanded. Such an event books nothing here; subscribe the endpoint to
// refund.created, refund.updated and refund.failed as well, which carry each
// refund (see README).
func chargeRefunded(ctx context.Context, tx DB, ev Event) (Result, error) {
	var env struct {
		Data struct {
			Object charge `json:"object"`
		} `json:"data"`
	}
	if err := json.Unmarshal(ev.Payload, &env); err != nil {
		return Result{}, fmt.Errorf("%w: %v", ErrBadPayload, err)
	}
	ch := env.Data.Object
	if ch.ID == "" {
		return Result{}, fmt.Errorf("%w: data.object.id", ErrBadPayload)
	}
	var refunds []refund
	if ch.Refunds != nil {
		// In id order, so that two events listing the same refunds lock them
		// in the same order.
		refunds = slices.SortedFunc(slices.Values(ch.Refunds.Data), func(a, b refund) int { return strings.Compare(a.ID, b.ID) })
	}
	for _, r := range refunds {
		if err := r.check(); err != nil {
			return Result{}, fmt.Errorf("%w (in charge %s)", err, ch.ID)
		}
	}
	// The link first: applyRefund takes the link rows before the refund's.
	if inv := idOf(ch.Invoice); inv != "" {
		if err := link(ctx, tx, ev, inv, paymentIDs(ch.ID, idOf(ch.PaymentIntent))); err != nil {
			return Result{}, err
		}
	}
	for _, r := range refunds {
		if idOf(r.Charge) == "" {
			r.Charge = ch.ID
		}
		if idOf(r.PaymentIntent) == "" {
			r.PaymentIntent = ch.PaymentIntent
		}
		if r.Currency == "" {
			r.Currency = ch.Currency
		}
		if err := applyRefundTo(ctx, tx, ev, r); err != nil {
			return Result{}, err
		}
	}
	return Result{Outcome: Applied}, nil
}

// refund.created, refund.updated, refund.failed and charge.refund.updated:
// apply the refund (see applyRefundTo).
func refundChanged(ctx context.Context, tx DB, ev Event) (Result, error) {
	var env struct {
		Data struct {
			Object refund `json:"object"`
		} `json:"data"`
	}
	if err := json.Unmarshal(ev.Payload, &env); err != nil {
		return Result{}, fmt.Errorf("%w: %v", ErrBadPayload, err)
	}
	r := env.Data.Object
	if err := r.check(); err != nil {
		return Result{}, err
	}
	return Result{Outcome: Applied}, applyRefundTo(ctx, tx, ev, r)
}

func (r refund) check() error {
	if r.ID == "" {
		return fmt.Errorf("%w: a refund without id", ErrBadPayload)
	}
	if !slices.Contains(refundStatuses, r.Status) {
		return fmt.Errorf("%w: refund %s has status %q, not one of %s", ErrBadPayload, r.ID, r.Status, strings.Join(refundStatuses, ", "))
	}
	if r.Amount <= 0 {
		return fmt.Errorf("%w: refund %s has amount %d", ErrBadPayload, r.ID, r.Amount)
	}
	return nil
}

// applyRefundTo merges this observation of r into its row and books what the
// row calls for, in one statement (applyRefund).
func applyRefundTo(ctx context.Context, tx DB, ev Event, r refund) error {
	ch, pi := idOf(r.Charge), idOf(r.PaymentIntent)
	if _, err := tx.Exec(ctx, applyRefund, r.ID, nullIfEmpty(ch), nullIfEmpty(pi), r.Amount, nullIfEmpty(r.Currency), r.Status, ev.ID,
		paymentIDs(ch, pi)); err != nil {
		return fmt.Errorf("applying refund %s (%s): %w", r.ID, r.Status, err)
	}
	return nil
}

// invoice_payment.paid (2025-03-31.basil and later): record which charge or
// PaymentIntent paid the invoice. The payment itself is booked by
// invoice.paid.
func invoicePaymentPaid(ctx context.Context, tx DB, ev Event) (Result, error) {
	var env struct {
		Data struct {
			Object invoicePayment `json:"object"`
		} `json:"data"`
	}
	if err := json.Unmarshal(ev.Payload, &env); err != nil {
		return Result{}, fmt.Errorf("%w: %v", ErrBadPayload, err)
	}
	p := env.Data.Object
	inv := idOf(p.Invoice)
	if inv == "" {
		return Result{}, fmt.Errorf("%w: data.object.invoice", ErrBadPayload)
	}
	return Result{Outcome: Applied}, link(ctx, tx, ev, inv, paymentIDs(idOf(p.Payment.Charge), idOf(p.Payment.PaymentIntent)))
}
