package handlers

import (
	"context"
	"encoding/json"
	"fmt"
)

// invoice is the part of a Stripe Invoice the handlers read.
type invoice struct {
	ID         string  `json:"id"`
	Customer   *string `json:"customer"`
	Currency   string  `json:"currency"`
	AmountDue  int64   `json:"amount_due"`
	AmountPaid int64   `json:"amount_paid"`
	// The payment, on API versions before 2025-03-31.basil: a charge id or
	// an expanded Charge.
	Charge any `json:"charge"`
	// The payments, from 2025-03-31.basil on, when the payload includes
	// them: each names a charge or a PaymentIntent.
	Payments *struct {
		Data []invoicePayment `json:"data"`
	} `json:"payments"`

	created int64 // the event's created: when Stripe took this snapshot
}

// invoicePayment is the part of a Stripe InvoicePayment the handlers read.
type invoicePayment struct {
	Invoice any `json:"invoice"` // an id or an expanded Invoice
	Payment struct {
		Charge        any `json:"charge"`
		PaymentIntent any `json:"payment_intent"`
	} `json:"payment"`
}

func parseInvoice(ev Event) (invoice, error) {
	var env struct {
		Created int64 `json:"created"`
		Data    struct {
			Object invoice `json:"object"`
		} `json:"data"`
	}
	if err := json.Unmarshal(ev.Payload, &env); err != nil {
		return invoice{}, fmt.Errorf("%w: %v", ErrBadPayload, err)
	}
	inv := env.Data.Object
	if inv.ID == "" {
		return invoice{}, fmt.Errorf("%w: data.object.id", ErrBadPayload)
	}
	inv.created = env.Created
	return inv, nil
}

func (inv invoice) customer() string {
	if inv.Customer == nil {
		return ""
	}
	return *inv.Customer
}

// payments returns the charges and PaymentIntents the invoice names, sorted.
func (inv invoice) payments() []string {
	ids := []string{idOf(inv.Charge)}
	if inv.Payments != nil {
		for _, p := range inv.Payments.Data {
			ids = append(ids, idOf(p.Payment.Charge), idOf(p.Payment.PaymentIntent))
		}
	}
	return paymentIDs(ids...)
}

// statusRank orders invoice snapshots of the same created second: a later
// status in the lifecycle is the newer snapshot.
var statusRank = map[string]int16{"draft": 0, "open": 1, "uncollectible": 2, "paid": 3, "void": 3}

// The states each target may replace (see queries.go).
var (
	fromForOpen          = []string{"draft"}
	fromForPaid          = []string{"draft", "open", "uncollectible"}
	fromForVoid          = []string{"draft", "open", "uncollectible"}
	fromForUncollectible = []string{"draft", "open"}
)

func transition(ctx context.Context, tx DB, ev Event, inv invoice, target string, from []string) error {
	if _, err := tx.Exec(ctx, upsertInvoice, inv.ID, inv.customer(), target, nullIfEmpty(inv.Currency), inv.AmountDue, inv.AmountPaid, from,
		inv.created, statusRank[target], ev.ID); err != nil {
		return fmt.Errorf("moving invoice %s to %s: %w", inv.ID, target, err)
	}
	return link(ctx, tx, ev, inv.ID, inv.payments())
}

// link records that payments paid invoiceID (and ev is the event that
// says so) and, when a refund of one of them may still be booked under
// another key, attributes it to the invoice and moves its entries there.
func link(ctx context.Context, tx DB, ev Event, invoiceID string, payments []string) error {
	if len(payments) == 0 {
		return nil
	}
	var attribute bool
	if err := tx.QueryRow(ctx, linkPayments, invoiceID, payments).Scan(&attribute); err != nil {
		return fmt.Errorf("linking payments %v to invoice %s: %w", payments, invoiceID, err)
	}
	if attribute {
		return attributeRefundsTo(ctx, tx, ev, invoiceID, payments)
	}
	return nil
}

func attributeRefundsTo(ctx context.Context, tx DB, ev Event, invoiceID string, payments []string) error {
	if _, err := tx.Exec(ctx, attributeRefunds, invoiceID, payments, ev.ID); err != nil {
		return fmt.Errorf("attributing refunds of %v to invoice %s: %w", payments, invoiceID, err)
	}
	return nil
}

// invoice.created: create the invoice as a draft if absent; never changes an
// existing one (a late invoice.created must not roll back a paid invoice).
func invoiceCreated(ctx context.Context, tx DB, ev Event) (Result, error) {
	inv, err := parseInvoice(ev)
	if err != nil {
		return Result{}, err
	}
	return Result{Outcome: Applied}, transition(ctx, tx, ev, inv, "draft", nil)
}

// invoice.finalized: draft -> open, or create it open.
func invoiceFinalized(ctx context.Context, tx DB, ev Event) (Result, error) {
	inv, err := parseInvoice(ev)
	if err != nil {
		return Result{}, err
	}
	return Result{Outcome: Applied}, transition(ctx, tx, ev, inv, "open", fromForOpen)
}

// invoice.voided: to void unless already paid (never un-pay).
func invoiceVoided(ctx context.Context, tx DB, ev Event) (Result, error) {
	inv, err := parseInvoice(ev)
	if err != nil {
		return Result{}, err
	}
	return Result{Outcome: Applied}, transition(ctx, tx, ev, inv, "void", fromForVoid)
}

// invoice.marked_uncollectible: open -> uncollectible; never from paid or void.
func invoiceMarkedUncollectible(ctx context.Context, tx DB, ev Event) (Result, error) {
	inv, err := parseInvoice(ev)
	if err != nil {
		return Result{}, err
	}
	return Result{Outcome: Applied}, transition(ctx, tx, ev, inv, "uncollectible", fromForUncollectible)
}

// invoice.paid: move to paid unless void, then book the payment once per
// invoice. The outbox row is written only when the entry is newly booked, so
// a second Event object for the same payment notifies no one twice. A payment
// on a void invoice books nothing and raises an anomaly.
//
// The common cases (the invoice moves to paid, or it was already paid) take
// one statement, which also records the invoice's payment links; a payment
// on a void invoice takes a second one to record the anomaly, and a link to
// a payment whose refunds were booked before it was known takes a second
// one to move them to the invoice.
func invoicePaid(ctx context.Context, tx DB, ev Event) (Result, error) {
	inv, err := parseInvoice(ev)
	if err != nil {
		return Result{}, err
	}
	payload, _ := json.Marshal(map[string]any{
		"invoice_id": inv.ID, "customer_id": inv.customer(), "amount": inv.AmountPaid, "currency": inv.Currency, "event_id": ev.ID,
	})
	var (
		now, seen *string
		move      bool
	)
	payments := inv.payments()
	err = tx.QueryRow(ctx, payInvoice, inv.ID, inv.customer(), "paid", nullIfEmpty(inv.Currency), inv.AmountDue, inv.AmountPaid, fromForPaid,
		inv.created, statusRank["paid"], ev.ID, "InvoicePaymentBooked", string(payload), payments).Scan(&now, &seen, &move)
	if err != nil {
		return Result{}, fmt.Errorf("paying invoice %s: %w", inv.ID, err)
	}
	if move {
		if err := attributeRefundsTo(ctx, tx, ev, inv.ID, payments); err != nil {
			return Result{}, err
		}
	}
	var status string
	switch {
	case now != nil:
		status = *now // this statement changed the row: the latest version
	case seen != nil && (*seen == "paid" || *seen == "void"):
		status = *seen // final: the latest version has it too
	default:
		if err := tx.QueryRow(ctx, invoiceStatus, inv.ID).Scan(&status); err != nil {
			return Result{}, fmt.Errorf("reading the status of invoice %s: %w", inv.ID, err)
		}
	}
	if status == "paid" {
		// Moved to paid and booked by this statement, or paid by another
		// event (a second Event object for the same payment), which booked
		// it in the same transaction.
		return Result{Outcome: Applied}, nil
	}
	detail, _ := json.Marshal(map[string]any{"status": status, "amount_paid": inv.AmountPaid, "currency": inv.Currency})
	if _, err := tx.Exec(ctx, raiseAnomaly, "payment_on_"+status+"_invoice", inv.ID, ev.Endpoint, ev.ID, string(detail)); err != nil {
		return Result{}, fmt.Errorf("recording anomaly for invoice %s: %w", inv.ID, err)
	}
	return Result{Outcome: Applied, Anomaly: true}, nil
}

func nullIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
