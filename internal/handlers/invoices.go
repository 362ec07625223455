package handlers

import (
	"context"
	"encoding/json"
	"fmt"
)

// invoice is the part of a Stripe Invoice the handlers read; contract says
// how (see contract.go and releases.go).
type invoice struct {
	ID         Str `json:"id"`
	Customer   ID  `json:"customer"`
	Currency   Str `json:"currency"`
	AmountDue  Int `json:"amount_due"`
	AmountPaid Int `json:"amount_paid"`
	// The payment, up to acacia: a charge id or an expanded Charge.
	Charge ID `json:"charge"`
	// The payments, from 2025-03-31.basil on, when the payload includes
	// them (stripe-mock v0.203.0's invoice, 2026-08-26.dahlia, does not).
	Payments *struct {
		Data []invoicePayment `json:"data"`
	} `json:"payments"`
}

func (inv *invoice) contract(c *checker) {
	c.want("id", inv.ID.Kind, String)
	c.nonEmpty("id", inv.ID.Kind, inv.ID.V)
	c.want("customer", inv.Customer.Kind, Ref|Null)
	c.want("currency", inv.Currency.Kind, String)
	c.want("amount_due", inv.AmountDue.Kind, Integer)
	c.want("amount_paid", inv.AmountPaid.Kind, Integer)
	c.want("charge", inv.Charge.Kind, Ref|Null|Absent) // removed in basil
	if inv.Payments != nil {
		for i := range inv.Payments.Data {
			c.in(fmt.Sprintf("payments.data[%d]", i), inv.Payments.Data[i].inList)
		}
	}
}

// invoicePayment is the part of a Stripe InvoicePayment the handlers read
// (2025-03-31.basil and later): the invoice_payment.paid event's object, and
// an element of invoice.payments.
type invoicePayment struct {
	Invoice ID                `json:"invoice"` // an id or an expanded Invoice
	Payment associatedPayment `json:"payment"`
}

// associatedPayment is InvoicePayment.payment: what paid the invoice.
type associatedPayment struct {
	// Type is charge or payment_intent (basil), or payment_record
	// (2025-10-29.clover and later: money paid outside Stripe).
	Type          Str `json:"type"`
	Charge        ID  `json:"charge"`
	PaymentIntent ID  `json:"payment_intent"`
	PaymentRecord ID  `json:"payment_record"`
}

// The types of InvoicePayment.payment (stripe-go 83.1.1: "Add support for
// value payment_record to enum InvoicePaymentPayment.Type").
const (
	paymentCharge        = "charge"
	paymentPaymentIntent = "payment_intent"
	paymentRecord        = "payment_record"
)

// contract: the invoice_payment.paid event's object.
func (p *invoicePayment) contract(c *checker) {
	c.want("invoice", p.Invoice.Kind, Ref)
	c.nonEmpty("invoice", p.Invoice.Kind, p.Invoice.V)
	c.in("payment", p.Payment.contract)
}

// inList: an element of invoice.payments (its invoice is the one listing it).
func (p *invoicePayment) inList(c *checker) { c.in("payment", p.Payment.contract) }

func (pay *associatedPayment) contract(c *checker) {
	c.want("type", pay.Type.Kind, String)
	c.oneOf("type", pay.Type, paymentCharge, paymentPaymentIntent, paymentRecord)
	// Each is present only for its type; a PaymentIntent is named only for
	// invoices finalized since 2019-03-15 (stripe-go v82,
	// InvoicePaymentPayment.PaymentIntent).
	c.want("charge", pay.Charge.Kind, Ref|Null|Absent)
	c.want("payment_intent", pay.PaymentIntent.Kind, Ref|Null|Absent)
	c.want("payment_record", pay.PaymentRecord.Kind, Ref|Null|Absent)
}

// stripePayments are the Stripe payments (charge, PaymentIntent) this
// invoice payment names. A payment record is money paid outside Stripe: no
// Stripe charge to link, refund or book.
func (pay associatedPayment) stripePayments() []string {
	if pay.Type.V == paymentRecord {
		return nil
	}
	return []string{pay.Charge.V, pay.PaymentIntent.V}
}

func (inv invoice) customer() string { return inv.Customer.V }

// payments returns the charges and PaymentIntents the invoice names, sorted.
func (inv invoice) payments() []string {
	ids := []string{inv.Charge.V}
	if inv.Payments != nil {
		for _, p := range inv.Payments.Data {
			ids = append(ids, p.Payment.stripePayments()...)
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

func transition(ctx context.Context, tx DB, ev Event, inv invoice, m Meta, target string, from []string) error {
	if _, err := tx.Exec(ctx, upsertInvoice, inv.ID.V, inv.customer(), target, nullIfEmpty(inv.Currency.V), inv.AmountDue.V, inv.AmountPaid.V, from,
		m.Created, statusRank[target], ev.ID); err != nil {
		return fmt.Errorf("moving invoice %s to %s: %w", inv.ID.V, target, err)
	}
	return link(ctx, tx, ev, inv.ID.V, inv.payments())
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
func invoiceCreated(ctx context.Context, tx DB, ev Event, inv invoice, m Meta) (Result, error) {
	return Result{Outcome: Applied}, transition(ctx, tx, ev, inv, m, "draft", nil)
}

// invoice.finalized: draft -> open, or create it open.
func invoiceFinalized(ctx context.Context, tx DB, ev Event, inv invoice, m Meta) (Result, error) {
	return Result{Outcome: Applied}, transition(ctx, tx, ev, inv, m, "open", fromForOpen)
}

// invoice.voided: to void unless already paid (never un-pay).
func invoiceVoided(ctx context.Context, tx DB, ev Event, inv invoice, m Meta) (Result, error) {
	return Result{Outcome: Applied}, transition(ctx, tx, ev, inv, m, "void", fromForVoid)
}

// invoice.marked_uncollectible: open -> uncollectible; never from paid or void.
func invoiceMarkedUncollectible(ctx context.Context, tx DB, ev Event, inv invoice, m Meta) (Result, error) {
	return Result{Outcome: Applied}, transition(ctx, tx, ev, inv, m, "uncollectible", fromForUncollectible)
}

// invoice.paid: move to paid unless void, then book the payment once per
// invoice. The outbox row and the write-back intent (when on) are written
// only when the entry is newly booked, so a second Event object for the same
// payment notifies no one twice and asks for no second write-back. A payment
// on a void invoice books nothing and raises an anomaly.
//
// The common cases (the invoice moves to paid, or it was already paid) take
// one statement, which also records the invoice's payment links; a payment
// on a void invoice takes a second one to record the anomaly, and a link to
// a payment whose refunds were booked before it was known takes a second
// one to move them to the invoice.
func (o Options) invoicePaid(ctx context.Context, tx DB, ev Event, inv invoice, m Meta) (Result, error) {
	payload, _ := json.Marshal(map[string]any{
		"invoice_id": inv.ID.V, "customer_id": inv.customer(), "amount": inv.AmountPaid.V, "currency": inv.Currency.V, "event_id": ev.ID,
	})
	var (
		now, seen *string
		move      bool
	)
	payments := inv.payments()
	err := tx.QueryRow(ctx, payInvoice, inv.ID.V, inv.customer(), "paid", nullIfEmpty(inv.Currency.V), inv.AmountDue.V, inv.AmountPaid.V, fromForPaid,
		m.Created, statusRank["paid"], ev.ID, "InvoicePaymentBooked", string(payload), payments,
		o.WritebackOn(WritebackCustomerMetadata)).Scan(&now, &seen, &move)
	if err != nil {
		return Result{}, fmt.Errorf("paying invoice %s: %w", inv.ID.V, err)
	}
	if move {
		if err := attributeRefundsTo(ctx, tx, ev, inv.ID.V, payments); err != nil {
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
		if err := tx.QueryRow(ctx, invoiceStatus, inv.ID.V).Scan(&status); err != nil {
			return Result{}, fmt.Errorf("reading the status of invoice %s: %w", inv.ID.V, err)
		}
	}
	if status == "paid" {
		// Moved to paid and booked by this statement, or paid by another
		// event (a second Event object for the same payment), which booked
		// it in the same transaction.
		return Result{Outcome: Applied}, nil
	}
	detail, _ := json.Marshal(map[string]any{"status": status, "amount_paid": inv.AmountPaid.V, "currency": inv.Currency.V})
	if _, err := tx.Exec(ctx, raiseAnomaly, "payment_on_"+status+"_invoice", inv.ID.V, ev.Endpoint, ev.ID, string(detail)); err != nil {
		return Result{}, fmt.Errorf("recording anomaly for invoice %s: %w", inv.ID.V, err)
	}
	return Result{Outcome: Applied, Anomaly: true}, nil
}

func nullIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
