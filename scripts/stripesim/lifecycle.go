package main

import (
	"fmt"
	"maps"
	"math/rand/v2"

	"github.com/stripe-inbox/inbox/internal/stripetest"
)

// event is one Stripe Event object as the simulator sends it.
type event struct {
	ID   string
	Type string
	Body []byte // unsigned JSON; each delivery attempt signs it afresh
}

// expected is the state the database must reach once every event has been
// processed, whatever the order of delivery.
type expected struct {
	// Invoices maps each invoice id to its final status and amount_paid.
	Invoices map[string]invoiceState
	// Payments maps each paid invoice id to the amount of its one
	// 'payment' ledger entry (and its one InvoicePaymentBooked outbox row).
	Payments map[string]int64
	// Refunds maps each refund id to the (negative) amount of its one
	// 'refund:<id>' ledger entry.
	Refunds map[string]int64
}

type invoiceState struct {
	Status     string
	AmountPaid int64
}

// lifecycle is one invoice's story. Every story has a final state that does
// not depend on the order its events are applied in: the handlers never leave
// a final state (paid, void), and no story reaches two final states (a
// payment and a void on one invoice would end in whichever came first).
type lifecycle struct {
	name    string
	weight  int
	steps   []string // invoice event types, in Stripe's order
	final   string
	refunds int // refunds after payment (only for stories ending paid)
}

var lifecycles = []lifecycle{
	{name: "draft", weight: 5, steps: []string{"invoice.created"}, final: "draft"},
	{name: "open", weight: 10, steps: []string{"invoice.created", "invoice.finalized"}, final: "open"},
	{name: "paid", weight: 30, steps: []string{"invoice.created", "invoice.finalized", "invoice.paid"}, final: "paid"},
	{name: "void", weight: 10, steps: []string{"invoice.created", "invoice.finalized", "invoice.voided"}, final: "void"},
	{name: "uncollectible", weight: 5, steps: []string{"invoice.created", "invoice.finalized", "invoice.marked_uncollectible"}, final: "uncollectible"},
	{name: "uncollectible_paid", weight: 10, steps: []string{"invoice.created", "invoice.finalized", "invoice.marked_uncollectible", "invoice.paid"}, final: "paid"},
	{name: "uncollectible_void", weight: 5, steps: []string{"invoice.created", "invoice.finalized", "invoice.marked_uncollectible", "invoice.voided"}, final: "void"},
	{name: "paid_refunded_once", weight: 15, steps: []string{"invoice.created", "invoice.finalized", "invoice.paid"}, final: "paid", refunds: 1},
	{name: "paid_refunded_twice", weight: 10, steps: []string{"invoice.created", "invoice.finalized", "invoice.paid"}, final: "paid", refunds: 2},
}

// statusAfter is the invoice status Stripe reports in each event's object.
var statusAfter = map[string]string{
	"invoice.created":              "draft",
	"invoice.finalized":            "open",
	"invoice.paid":                 "paid",
	"invoice.voided":               "void",
	"invoice.marked_uncollectible": "uncollectible",
}

// scenario is everything the simulator generated for one run.
type scenario struct {
	Events   []event
	Twins    int // facts sent as a second Event object with its own id
	Expected expected
}

// generate builds n invoice stories for run, deterministically from rng.
// twinRate is the share of events that Stripe also sends as a second Event
// object (a new id, the same content).
func generate(rng *rand.Rand, run string, n int, twinRate float64) scenario {
	total := 0
	for _, l := range lifecycles {
		total += l.weight
	}
	s := scenario{Expected: expected{
		Invoices: map[string]invoiceState{},
		Payments: map[string]int64{},
		Refunds:  map[string]int64{},
	}}
	seq := 0
	emit := func(typ string, object map[string]any) {
		seq++
		id := fmt.Sprintf("evt_%s_%06d", run, seq)
		s.Events = append(s.Events, event{ID: id, Type: typ, Body: stripetest.Event(id, typ, object)})
		if rng.Float64() < twinRate {
			seq++
			twin := fmt.Sprintf("evt_%s_%06d", run, seq)
			s.Events = append(s.Events, event{ID: twin, Type: typ, Body: stripetest.Event(twin, typ, object)})
			s.Twins++
		}
	}
	for i := range n {
		pick := rng.IntN(total)
		var l lifecycle
		for _, l = range lifecycles {
			if pick < l.weight {
				break
			}
			pick -= l.weight
		}
		inv := fmt.Sprintf("in_%s_%06d", run, i)
		customer := fmt.Sprintf("cus_%s_%04d", run, rng.IntN(500))
		amount := int64(100 + rng.IntN(99_900))
		for _, typ := range l.steps {
			emit(typ, stripetest.Invoice(inv, customer, statusAfter[typ], amount))
		}
		st := invoiceState{Status: l.final}
		if l.final == "paid" {
			st.AmountPaid = amount
			s.Expected.Payments[inv] = amount
		}
		s.Expected.Invoices[inv] = st

		// Refunds: after each one Stripe sends refund.created and a
		// charge.refunded whose expanded refund list holds every refund so
		// far, so the first refund arrives in three events.
		charge := fmt.Sprintf("ch_%s_%06d", run, i)
		so := map[string]int64{}
		left := amount
		for k := range l.refunds {
			refund := fmt.Sprintf("re_%s_%06d_%d", run, i, k)
			amt := left / 2
			if k == l.refunds-1 {
				amt = left
			}
			left -= amt
			so[refund] = amt
			s.Expected.Refunds[refund] = -amt
			emit("refund.created", stripetest.Refund(refund, charge, amt))
			emit("charge.refunded", stripetest.ChargeWithRefunds(charge, inv, maps.Clone(so)))
		}
	}
	return s
}
