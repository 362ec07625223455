package stripetest

import (
	"encoding/json"
	"fmt"
)

// One payment-and-refund story told in the shape of each API version Stripe
// sends today (see internal/handlers/releases.go for the changelog entries):
// the invoice is created, finalized and paid by card, the invoice payment
// links the payment where the version has one, and a refund goes pending,
// then succeeded. Every object starts from stripe-mock's fixture
// (Fixture), which is rendered in a dahlia version, and is changed only as
// the changelogs say the older versions differ.

// Shape is how one API version renders the story.
type Shape struct {
	// Name says which version it stands for (a test's name).
	Name string
	// Version is the events' api_version.
	Version string
	// ChargeOnInvoice: the invoice names its charge and PaymentIntent
	// (invoice.charge, payment_intent, paid, paid_out_of_band) and the charge
	// its invoice; no invoice_payment.paid (up to acacia; removed in
	// 2025-03-31.basil).
	ChargeOnInvoice bool
	// PaymentRecord: the invoice also carries a payment recorded outside
	// Stripe (an invoice_payment.paid of type payment_record,
	// 2025-10-29.clover and later), which must link and book nothing.
	PaymentRecord bool
	// Since is the version's date: fields Stripe added later are left out
	// (customer_account 2025-12-15.clover, amount_paid_off_stripe
	// 2026-05-27.dahlia, refund.customer, customer_account and
	// payment_method 2026-07-29.dahlia).
	Since string
}

// Shapes are the version shapes of today, and one invented future release
// (the handlers have not named it: booked when its shape holds, counted as
// drift).
func Shapes() []Shape {
	return []Shape{
		{Name: "dated 2024-06-20", Version: "2024-06-20", ChargeOnInvoice: true, Since: "2024-06-20"},
		{Name: "acacia", Version: "2024-09-30.acacia", ChargeOnInvoice: true, Since: "2024-09-30"},
		{Name: "basil", Version: "2025-03-31.basil", Since: "2025-03-31"},
		{Name: "clover", Version: "2025-09-30.clover", Since: "2025-09-30"},
		{Name: "clover payment_record", Version: "2025-10-29.clover", PaymentRecord: true, Since: "2025-10-29"},
		{Name: "dahlia", Version: FixtureAPIVersion(), PaymentRecord: true, Since: FixtureAPIVersion()[:10]},
		{Name: "invented future release", Version: InventedRelease, PaymentRecord: true, Since: InventedRelease[:10]},
	}
}

// InventedRelease is a release Stripe has not shipped (as of this code).
const InventedRelease = "2027-03-31.fig"

// StoryAmount and StoryRefund are the story's amounts: every shape books
// "<invoice> payment 1000" and "<invoice> refund:<refund> -300".
const (
	StoryAmount = 1000
	StoryRefund = 300
)

// StoryIDs are the ids of one telling of the story.
type StoryIDs struct {
	Invoice, Charge, PaymentIntent, Refund, PaymentRecord string
}

// IDs are the ids of the story told with key.
func (sh Shape) IDs(key string) StoryIDs {
	return StoryIDs{Invoice: "in_" + key, Charge: "ch_" + key, PaymentIntent: "pi_" + key, Refund: "re_" + key, PaymentRecord: "pr_" + key}
}

// Story is the story in this shape, its ids made with key, in the order
// Stripe creates the events (created one second apart from created).
func (sh Shape) Story(key string, created int64) []Generated {
	ids := sh.IDs(key)
	var out []Generated
	add := func(typ string, object map[string]any) {
		id := fmt.Sprintf("evt_%s_%02d", key, len(out)+1)
		out = append(out, Generated{ID: id, Type: typ, Payload: sh.event(id, typ, created+int64(len(out)), object)})
	}
	add("invoice.created", sh.invoice(ids, "draft"))
	add("invoice.finalized", sh.invoice(ids, "open"))
	add("invoice.paid", sh.invoice(ids, "paid"))
	if !sh.ChargeOnInvoice {
		add("invoice_payment.paid", sh.invoicePayment(ids, "payment_intent"))
	}
	if sh.PaymentRecord {
		add("invoice_payment.paid", sh.invoicePayment(ids, "payment_record"))
	}
	add("refund.created", sh.refund(ids, "pending"))
	add("refund.updated", sh.refund(ids, "succeeded"))
	return out
}

// Event is one event of the story in this shape (for tests that change it).
func (sh Shape) event(id, typ string, created int64, object map[string]any) []byte {
	var m map[string]any
	if err := json.Unmarshal(EventWith(id, typ, Meta{Created: created}, object), &m); err != nil {
		panic(err)
	}
	m["api_version"] = sh.Version
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

func (sh Shape) invoice(ids StoryIDs, status string) map[string]any {
	o := Fixture("invoice")
	o["id"], o["status"], o["customer"], o["currency"] = ids.Invoice, status, "cus_story", "usd"
	o["amount_due"], o["amount_paid"], o["amount_remaining"], o["total"], o["subtotal"] = StoryAmount, 0, StoryAmount, StoryAmount, StoryAmount
	if status == "paid" {
		o["amount_paid"], o["amount_remaining"] = StoryAmount, 0
	}
	if sh.ChargeOnInvoice {
		for _, f := range []string{"amount_overpaid", "parent"} {
			delete(o, f) // basil's
		}
		o["charge"], o["payment_intent"], o["paid"], o["paid_out_of_band"] = nil, nil, false, false
		if status == "paid" {
			o["charge"], o["payment_intent"], o["paid"] = ids.Charge, ids.PaymentIntent, true
		}
	}
	if sh.Since < "2025-12-15" {
		delete(o, "customer_account")
	}
	if sh.Since < "2026-05-27" {
		delete(o, "amount_paid_off_stripe")
	}
	return o
}

func (sh Shape) invoicePayment(ids StoryIDs, typ string) map[string]any {
	o := Fixture("invoice_payment")
	o["id"], o["invoice"], o["currency"], o["status"] = "inpay_"+typ+"_"+ids.Invoice, ids.Invoice, "usd", "paid"
	o["is_default"] = typ == "payment_intent"
	switch typ {
	case "payment_intent":
		o["amount_paid"], o["amount_requested"] = StoryAmount, StoryAmount
		o["payment"] = map[string]any{"type": "payment_intent", "payment_intent": ids.PaymentIntent}
	case "payment_record":
		// Money recorded outside Stripe (a bank transfer the business
		// received itself), attached to the invoice: no Stripe charge.
		o["amount_paid"], o["amount_requested"] = 0, 0
		o["payment"] = map[string]any{"type": "payment_record", "payment_record": ids.PaymentRecord}
	}
	return o
}

func (sh Shape) refund(ids StoryIDs, status string) map[string]any {
	o := Fixture("refund")
	o["id"], o["amount"], o["currency"], o["status"] = ids.Refund, StoryRefund, "usd", status
	o["charge"], o["payment_intent"] = ids.Charge, ids.PaymentIntent
	if sh.Since < "2026-07-29" {
		for _, f := range []string{"customer", "customer_account", "payment_method"} {
			delete(o, f)
		}
	}
	return o
}

// StoryLedger is what the story books, as "invoice kind amount" lines.
func (sh Shape) StoryLedger(key string) []string {
	ids := sh.IDs(key)
	return []string{
		fmt.Sprintf("%s payment %d", ids.Invoice, StoryAmount),
		fmt.Sprintf("%s refund:%s %d", ids.Invoice, ids.Refund, -StoryRefund),
	}
}
