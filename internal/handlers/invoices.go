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
	// Whether the invoice was paid outside Stripe, up to acacia (removed
	// in 2025-03-31.basil, whose amount_paid counts such payments).
	PaidOutOfBand Flag `json:"paid_out_of_band"`
	// The amount paid outside Stripe, from 2026-05-27.dahlia on, when the
	// payload includes it ("The property isn't available in event
	// payloads", https://docs.stripe.com/changelog/dahlia/2026-05-27/invoice-object-amount-paid-off-stripe-property;
	// stripe-mock v0.203.0's invoice has it).
	AmountPaidOffStripe Int `json:"amount_paid_off_stripe"`
}

func (inv *invoice) contract(c *checker) {
	c.want("id", inv.ID.Kind, String)
	c.nonEmpty("id", inv.ID.Kind, inv.ID.V)
	c.want("customer", inv.Customer.Kind, Ref|Null)
	c.want("currency", inv.Currency.Kind, String)
	c.want("amount_due", inv.AmountDue.Kind, Integer)
	c.want("amount_paid", inv.AmountPaid.Kind, Integer)
	c.want("charge", inv.Charge.Kind, Ref|Null|Absent)              // removed in basil
	c.want("paid_out_of_band", inv.PaidOutOfBand.Kind, Bool|Absent) // removed in basil
	c.want("amount_paid_off_stripe", inv.AmountPaidOffStripe.Kind, Integer|Null|Absent)
	if c.bad == nil && inv.AmountPaidOffStripe.Kind == KindInteger && inv.AmountPaid.Kind == KindInteger &&
		(inv.AmountPaidOffStripe.V < 0 || inv.AmountPaidOffStripe.V > inv.AmountPaid.V) {
		c.bad = &ContractError{Field: c.path("amount_paid_off_stripe"), Want: "an integer from 0 to amount_paid", Got: fmt.Sprint(inv.AmountPaidOffStripe.V)}
	}
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
	// Read of a payment_record only: the amount paid outside Stripe.
	AmountPaid Int `json:"amount_paid"`
	Status     Str `json:"status"`
	Currency   Str `json:"currency"`
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
	p.inList(c)
}

// inList: an element of invoice.payments (its invoice is the one listing it).
func (p *invoicePayment) inList(c *checker) {
	c.in("payment", p.Payment.contract)
	if p.Payment.Type.V == paymentRecord {
		// stripe-go v82 InvoicePayment: AmountPaid ("Amount that was
		// actually paid for this invoice ... This field is null until the
		// payment is paid"), Status (canceled, open, paid).
		c.want("amount_paid", p.AmountPaid.Kind, Integer|Null)
		c.want("status", p.Status.Kind, String)
		c.oneOf("status", p.Status, "canceled", "open", "paid")
	}
}

// outsideStripe is the amount a paid invoice payment of type
// payment_record says was paid outside Stripe; 0 for any other.
func (p invoicePayment) outsideStripe() int64 {
	if p.Payment.Type.V != paymentRecord || p.Status.V != "paid" || p.AmountPaid.V < 0 {
		return 0
	}
	return p.AmountPaid.V
}

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

// split is the invoice's amount_paid as paid through Stripe and outside
// it, from what the payload says (each version's shape, releases.go):
//
//   - paid_out_of_band: true (up to acacia): all of it outside Stripe;
//   - amount_paid_off_stripe (2026-05-27.dahlia on, when the payload
//     includes it): that much outside Stripe;
//   - payments (2025-03-31.basil on, when the payload includes them): the
//     paid payment_record payments (2025-10-29.clover on) outside Stripe,
//     at most amount_paid;
//   - none of these: all of it through Stripe. From basil on amount_paid
//     counts out-of-band payments too, so an invoice.paid without any of
//     these fields cannot tell them apart: invoicePaymentPaid raises an
//     anomaly for a payment_record with money in it (docs/events.md).
func (inv invoice) split() (stripe, outside int64) {
	paid := inv.AmountPaid.V
	switch {
	case inv.PaidOutOfBand.V:
		return 0, paid
	case inv.AmountPaidOffStripe.Kind == KindInteger:
		return paid - inv.AmountPaidOffStripe.V, inv.AmountPaidOffStripe.V
	case inv.Payments != nil:
		for _, p := range inv.Payments.Data {
			outside += p.outsideStripe()
		}
		outside = min(outside, paid)
		return paid - outside, outside
	}
	return paid, 0
}

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
// status in the lifecycle is the newer snapshot. paid outranks void: an
// invoice both paid and voided ends paid (invoicePaid), so its paid
// snapshot is the newer one.
var statusRank = map[string]int16{"draft": 0, "open": 1, "uncollectible": 2, "void": 3, "paid": 4}

// The states each target may replace (see queries.go). fromVoidForPaid is
// the one move out of a final state: a payment processed after a void
// (invoicePaid).
var (
	fromForOpen          = []string{"draft"}
	fromForPaid          = []string{"draft", "open", "uncollectible"}
	fromVoidForPaid      = []string{"void"}
	fromForVoid          = []string{"draft", "open", "uncollectible"}
	fromForUncollectible = []string{"draft", "open"}
)

// transition moves the invoice to target (upsertInvoice) and records the
// payments it names (transitionLinking: one statement for both), then
// moves refunds and disputes booked before the link to the invoice.
func transition(ctx context.Context, tx DB, ev Event, inv invoice, m Meta, target string, from []string) error {
	args := []any{inv.ID.V, inv.customer(), target, nullIfEmpty(inv.Currency.V), inv.AmountDue.V, inv.AmountPaid.V, from,
		m.Created, statusRank[target], ev.ID, account(ev)}
	payments := inv.payments()
	if len(payments) == 0 {
		if _, err := tx.Exec(ctx, upsertInvoice, args...); err != nil {
			return fmt.Errorf("moving invoice %s to %s: %w", inv.ID.V, target, err)
		}
		return nil
	}
	var (
		moved     int64
		attribute bool
	)
	if err := tx.QueryRow(ctx, transitionLinking, append(args, payments)...).Scan(&moved, &attribute); err != nil {
		return fmt.Errorf("moving invoice %s to %s and linking payments %v: %w", inv.ID.V, target, payments, err)
	}
	if attribute {
		return attributeRefundsTo(ctx, tx, ev, inv.ID.V, payments)
	}
	return nil
}

// link records that payments paid invoiceID (and ev is the event that
// says so) and, when a refund of one of them may still be booked under
// another key, attributes it to the invoice and moves its entries there.
func link(ctx context.Context, tx DB, ev Event, invoiceID string, payments []string) error {
	if len(payments) == 0 {
		return nil
	}
	var attribute bool
	if err := tx.QueryRow(ctx, linkPayments, invoiceID, payments, account(ev)).Scan(&attribute); err != nil {
		return fmt.Errorf("linking payments %v to invoice %s: %w", payments, invoiceID, err)
	}
	if attribute {
		return attributeRefundsTo(ctx, tx, ev, invoiceID, payments)
	}
	return nil
}

// attributeRefundsTo moves the refunds and the disputes of payments to
// invoiceID (attributeRefunds: one statement for both).
func attributeRefundsTo(ctx context.Context, tx DB, ev Event, invoiceID string, payments []string) error {
	if _, err := tx.Exec(ctx, attributeRefunds, invoiceID, payments, ev.ID, account(ev)); err != nil {
		return fmt.Errorf("attributing refunds and disputes of %v to invoice %s: %w", payments, invoiceID, err)
	}
	return nil
}

// account is the event's connected account as the business tables record
// it: NULL for the platform's own.
func account(ev Event) *string { return nullIfEmpty(ev.Account) }

// invoice.created: create the invoice as a draft if absent; never changes an
// existing one (a late invoice.created must not roll back a paid invoice).
func invoiceCreated(ctx context.Context, tx DB, ev Event, inv invoice, m Meta) (Result, error) {
	return Result{Outcome: Applied}, transition(ctx, tx, ev, inv, m, "draft", nil)
}

// invoice.finalized: draft -> open, or create it open.
func invoiceFinalized(ctx context.Context, tx DB, ev Event, inv invoice, m Meta) (Result, error) {
	return Result{Outcome: Applied}, transition(ctx, tx, ev, inv, m, "open", fromForOpen)
}

// invoice.voided: to void unless already paid (never un-pay). A void that
// finds the invoice paid books nothing and raises the anomaly a payment
// that finds it void raises (invoicePaid): payment_on_void_invoice, one per
// invoice, its detail saying which came first. Either order ends the same:
// the invoice paid, its payment booked once, one anomaly (a lost payment is
// worse than a contradiction a human settles; the runbook,
// docs/operations.md, says how).
func invoiceVoided(ctx context.Context, tx DB, ev Event, inv invoice, m Meta) (Result, error) {
	var (
		now, seen *string
		attribute bool
	)
	payments := inv.payments()
	if err := tx.QueryRow(ctx, voidInvoice, inv.ID.V, inv.customer(), "void", nullIfEmpty(inv.Currency.V), inv.AmountDue.V, inv.AmountPaid.V, fromForVoid,
		m.Created, statusRank["void"], ev.ID, account(ev), payments).Scan(&now, &seen, &attribute); err != nil {
		return Result{}, fmt.Errorf("voiding invoice %s: %w", inv.ID.V, err)
	}
	if attribute {
		if err := attributeRefundsTo(ctx, tx, ev, inv.ID.V, payments); err != nil {
			return Result{}, err
		}
	}
	status, err := finalStatus(ctx, tx, ev, inv.ID.V, now, seen)
	if err != nil || status != "paid" {
		return Result{Outcome: Applied}, err
	}
	detail, _ := json.Marshal(map[string]any{"status": status, "first": "paid", "voided_by": ev.ID})
	if _, err := tx.Exec(ctx, raiseAnomaly, paymentOnVoid, inv.ID.V, ev.Endpoint, ev.ID, string(detail), account(ev)); err != nil {
		return Result{}, fmt.Errorf("recording anomaly for invoice %s: %w", inv.ID.V, err)
	}
	return Result{Outcome: Applied, Anomaly: true}, nil
}

// paymentOnVoid is the anomaly of an invoice both paid and voided.
const paymentOnVoid = "payment_on_void_invoice"

// finalStatus is the invoice's status after a statement that returned now
// (the status it set or kept, NULL when it changed nothing) and seen (its
// snapshot's): paid is final, so a snapshot that saw it is current;
// otherwise the row may have changed after the snapshot (void is final but
// for a payment, which moves it to paid) and is read again, locked.
func finalStatus(ctx context.Context, tx DB, ev Event, id string, now, seen *string) (string, error) {
	switch {
	case now != nil:
		return *now, nil
	case seen != nil && *seen == "paid":
		return *seen, nil
	}
	var status string
	if err := tx.QueryRow(ctx, invoiceStatus, id, account(ev)).Scan(&status); err != nil {
		return "", fmt.Errorf("reading the status of invoice %s: %w", id, err)
	}
	return status, nil
}

// invoice.marked_uncollectible: open -> uncollectible; never from paid or void.
func invoiceMarkedUncollectible(ctx context.Context, tx DB, ev Event, inv invoice, m Meta) (Result, error) {
	return Result{Outcome: Applied}, transition(ctx, tx, ev, inv, m, "uncollectible", fromForUncollectible)
}

// invoice.paid: move to paid, then book the payment once per invoice: what
// was paid through Stripe as 'payment', what was paid outside Stripe as
// 'paid_out_of_band' (split), each with one outbox row
// (InvoicePaymentBooked, InvoicePaidOutOfBand) written only when the entry
// is newly booked, so a second Event object for the same payment notifies
// no one twice, and the write-back intent (when on) is recorded only then,
// so it asks for no second write-back. An invoice paid wholly outside
// Stripe has no 'payment'
// entry: no money moved through Stripe.
//
// A payment on a void invoice is booked all the same, and the invoice
// becomes paid: an invoice.paid is money that moved, and Stripe has no
// void -> paid (nor paid -> void) transition, so a payment and a void of
// one invoice are a contradiction for a human (payment_on_void_invoice,
// detail.first "void"), never a reason to drop money. The same end state
// as a void processed after the payment (invoiceVoided).
//
// The common cases (the invoice moves to paid, or it was already paid) take
// one statement, which also records the invoice's payment links (an invoice
// that names none takes a statement without that part, payInvoiceSQL); a
// link to a payment whose refunds or disputes were booked before it was
// known takes more to move them to the invoice. A payment on a void invoice takes two
// more: the first statement leaves a void row as it is (void is not in
// fromForPaid) and locked, so the status it returns or the locked read
// (finalStatus) is the latest one, even when the void committed after the
// statement's snapshot; then payInvoice again, from void only, books it,
// and the anomaly is recorded.
func (o Options) invoicePaid(ctx context.Context, tx DB, ev Event, inv invoice, m Meta) (Result, error) {
	status, err := o.payInvoiceFrom(ctx, tx, ev, inv, m, fromForPaid)
	if err != nil || status == "paid" {
		// Moved to paid and booked by this statement, or paid by another
		// event (a second Event object for the same payment, or a void's
		// payment), which booked it in the same transaction.
		return Result{Outcome: Applied}, err
	}
	if status != "void" {
		return Result{}, fmt.Errorf("paying invoice %s: it is %s after the payment", inv.ID.V, status)
	}
	if status, err = o.payInvoiceFrom(ctx, tx, ev, inv, m, fromVoidForPaid); err != nil {
		return Result{}, err
	}
	if status != "paid" {
		return Result{}, fmt.Errorf("paying void invoice %s: it is %s after the payment", inv.ID.V, status)
	}
	detail, _ := json.Marshal(map[string]any{"status": status, "amount_paid": inv.AmountPaid.V, "currency": inv.Currency.V, "first": "void", "paid_by": ev.ID})
	if _, err := tx.Exec(ctx, raiseAnomaly, paymentOnVoid, inv.ID.V, ev.Endpoint, ev.ID, string(detail), account(ev)); err != nil {
		return Result{}, fmt.Errorf("recording anomaly for invoice %s: %w", inv.ID.V, err)
	}
	return Result{Outcome: Applied, Anomaly: true}, nil
}

// payInvoiceFrom runs payInvoice with the states the payment may replace,
// moves refunds and disputes to the invoice when it linked their payment,
// and returns the invoice's latest status (finalStatus).
func (o Options) payInvoiceFrom(ctx context.Context, tx DB, ev Event, inv invoice, m Meta, from []string) (string, error) {
	viaStripe, outside := inv.split()
	payload := func(amount int64) string {
		// A struct, not a map: the same JSON (the column is jsonb) without
		// a map to build and sort for every invoice.paid.
		b, _ := json.Marshal(invoicePaidPayload{
			InvoiceID: inv.ID.V, CustomerID: inv.customer(), Amount: amount, Currency: inv.Currency.V, EventID: ev.ID,
			Account: account(ev),
		})
		return string(b)
	}
	var (
		now, seen *string
		move      bool
	)
	payments := inv.payments()
	sql := payInvoice[b2i(len(payments) > 0)][b2i(o.WritebackOn(WritebackCustomerMetadata))]
	err := tx.QueryRow(ctx, sql, inv.ID.V, inv.customer(), "paid", nullIfEmpty(inv.Currency.V), inv.AmountDue.V, inv.AmountPaid.V, from,
		m.Created, statusRank["paid"], ev.ID, account(ev), payload(viaStripe), payments, viaStripe, outside, payload(outside)).Scan(&now, &seen, &move)
	if err != nil {
		return "", fmt.Errorf("paying invoice %s: %w", inv.ID.V, err)
	}
	if move {
		if err := attributeRefundsTo(ctx, tx, ev, inv.ID.V, payments); err != nil {
			return "", err
		}
	}
	return finalStatus(ctx, tx, ev, inv.ID.V, now, seen)
}

// invoicePaidPayload is the payload of the outbox rows payInvoice queues
// (InvoicePaymentBooked, InvoicePaidOutOfBand).
type invoicePaidPayload struct {
	InvoiceID  string  `json:"invoice_id"`
	CustomerID string  `json:"customer_id"`
	Amount     int64   `json:"amount"`
	Currency   string  `json:"currency"`
	EventID    string  `json:"event_id"`
	Account    *string `json:"account"`
}

// b2i indexes a table of statements by a condition (payInvoice).
func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func nullIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
