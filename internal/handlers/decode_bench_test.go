package handlers

import (
	"testing"

	"github.com/stripe-inbox/inbox/internal/stripetest"
)

// The parse path of a drained receipt: an invoice.paid and a refund.updated
// of stripe-mock's shapes (every field Stripe sends), decoded and checked as
// a handler does before it touches the database.
//
//	go test -run '^$' -bench Decode -benchmem ./internal/handlers/
func BenchmarkDecode(b *testing.B) {
	inv := stripetest.Fixture("invoice")
	inv["id"], inv["status"], inv["amount_paid"] = "in_bench", "paid", 1000
	ref := stripetest.Fixture("refund")
	for name, ev := range map[string]Event{
		"invoice.paid":   {ID: "evt_1", Type: "invoice.paid", Payload: stripetest.Event("evt_1", "invoice.paid", inv)},
		"refund.updated": {ID: "evt_2", Type: "refund.updated", Payload: stripetest.Event("evt_2", "refund.updated", ref)},
	} {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(ev.Payload)))
			b.ReportAllocs()
			for b.Loop() {
				if err := benchParse(ev); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// benchParse is what a handler does before its first statement.
func benchParse(ev Event) error {
	var err error
	var m Meta
	if ev.Type == "invoice.paid" {
		_, m, err = decode[invoice](ev)
	} else {
		_, m, err = decode[refund](ev)
	}
	if verr := (Options{}).admit(ev, m.APIVersion); verr != nil {
		return verr
	}
	return err
}
