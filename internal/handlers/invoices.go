package handlers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// invoice is the part of a Stripe Invoice the handlers read.
type invoice struct {
	ID         string  `json:"id"`
	Customer   *string `json:"customer"`
	Currency   string  `json:"currency"`
	AmountDue  int64   `json:"amount_due"`
	AmountPaid int64   `json:"amount_paid"`
}

func parseInvoice(ev Event) (invoice, error) {
	var env struct {
		Data struct {
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
	return inv, nil
}

func (inv invoice) customer() string {
	if inv.Customer == nil {
		return ""
	}
	return *inv.Customer
}

// The states each target may replace (see queries.go).
var (
	fromForOpen          = []string{"draft"}
	fromForPaid          = []string{"draft", "open", "uncollectible"}
	fromForVoid          = []string{"draft", "open", "uncollectible"}
	fromForUncollectible = []string{"draft", "open"}
)

func transition(ctx context.Context, tx DB, inv invoice, target string, from []string) error {
	if _, err := tx.Exec(ctx, upsertInvoice, inv.ID, inv.customer(), target, nullIfEmpty(inv.Currency), inv.AmountDue, inv.AmountPaid, from); err != nil {
		return fmt.Errorf("moving invoice %s to %s: %w", inv.ID, target, err)
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
	return Result{Outcome: Applied}, transition(ctx, tx, inv, "draft", nil)
}

// invoice.finalized: draft -> open, or create it open.
func invoiceFinalized(ctx context.Context, tx DB, ev Event) (Result, error) {
	inv, err := parseInvoice(ev)
	if err != nil {
		return Result{}, err
	}
	return Result{Outcome: Applied}, transition(ctx, tx, inv, "open", fromForOpen)
}

// invoice.voided: to void unless already paid (never un-pay).
func invoiceVoided(ctx context.Context, tx DB, ev Event) (Result, error) {
	inv, err := parseInvoice(ev)
	if err != nil {
		return Result{}, err
	}
	return Result{Outcome: Applied}, transition(ctx, tx, inv, "void", fromForVoid)
}

// invoice.marked_uncollectible: open -> uncollectible; never from paid or void.
func invoiceMarkedUncollectible(ctx context.Context, tx DB, ev Event) (Result, error) {
	inv, err := parseInvoice(ev)
	if err != nil {
		return Result{}, err
	}
	return Result{Outcome: Applied}, transition(ctx, tx, inv, "uncollectible", fromForUncollectible)
}

// invoice.paid: move to paid unless void, then book the payment once per
// invoice. The outbox row is written only when the entry is newly booked, so
// a second Event object for the same payment notifies no one twice. A payment
// on a void invoice books nothing and raises an anomaly.
//
// The common cases (the invoice moves to paid, or it was already paid) take
// one statement; a payment on a void invoice takes a second one to record
// the anomaly.
func invoicePaid(ctx context.Context, tx DB, ev Event) (Result, error) {
	inv, err := parseInvoice(ev)
	if err != nil {
		return Result{}, err
	}
	payload, _ := json.Marshal(map[string]any{
		"invoice_id": inv.ID, "customer_id": inv.customer(), "amount": inv.AmountPaid, "currency": inv.Currency, "event_id": ev.ID,
	})
	var (
		moved bool
		seen  *string
	)
	err = tx.QueryRow(ctx, payInvoice, inv.ID, inv.customer(), "paid", nullIfEmpty(inv.Currency), inv.AmountDue, inv.AmountPaid, fromForPaid,
		ev.ID, "InvoicePaymentBooked", string(payload)).Scan(&moved, &seen)
	if err != nil {
		return Result{}, fmt.Errorf("paying invoice %s: %w", inv.ID, err)
	}
	if moved {
		return Result{Outcome: Applied}, nil
	}
	var status string
	if seen != nil && (*seen == "paid" || *seen == "void") {
		status = *seen // final: the latest version has it too
	} else if err := tx.QueryRow(ctx, invoiceStatus, inv.ID).Scan(&status); err != nil {
		return Result{}, fmt.Errorf("reading the status of invoice %s: %w", inv.ID, err)
	}
	if status == "paid" {
		// Paid by another event (a second Event object for the same
		// payment), which booked it in the same transaction.
		return Result{Outcome: Applied}, nil
	}
	detail, _ := json.Marshal(map[string]any{"status": status, "amount_paid": inv.AmountPaid, "currency": inv.Currency})
	if _, err := tx.Exec(ctx, raiseAnomaly, "payment_on_"+status+"_invoice", inv.ID, ev.Endpoint, ev.ID, string(detail)); err != nil {
		return Result{}, fmt.Errorf("recording anomaly for invoice %s: %w", inv.ID, err)
	}
	return Result{Outcome: Applied, Anomaly: true}, nil
}

// book inserts a ledger entry and reports whether it is new.
func book(ctx context.Context, tx DB, invoiceID, kind string, amount int64, currency, eventID string) (bool, error) {
	var id int64
	err := tx.QueryRow(ctx, bookLedgerEntry, invoiceID, kind, amount, nullIfEmpty(currency), eventID).Scan(&id)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("booking %s for %s: %w", kind, invoiceID, err)
	}
	return true, nil
}

func nullIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
