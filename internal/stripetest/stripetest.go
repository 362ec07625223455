// Package stripetest builds Stripe-shaped events and signs them the way
// Stripe does, for tests, the local sample sender, benchmarks and the load
// generator. It is never used on a request path.
package stripetest

import (
	"cmp"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"
)

// APIVersion is the version the generated events claim.
const APIVersion = "2025-03-31.basil"

// Created is the created timestamp Event gives its events.
const Created = 1764633600

// Event returns the JSON of a test-mode Stripe event of type typ about
// object, created at Created.
func Event(id, typ string, object map[string]any) []byte {
	return EventWith(id, typ, Meta{Created: Created}, object)
}

// Meta is what an event says about itself besides its object.
type Meta struct {
	Created  int64  // seconds since the epoch
	Livemode bool   // a live-mode event (real money) rather than a test-mode one
	Account  string // the connected account (acct_...) of a Connect event; "" for none
	// APIVersion is the event's api_version; "" is APIVersion.
	APIVersion string
}

// EventWith returns the JSON of a Stripe event of type typ about object,
// with the given created, livemode and account.
func EventWith(id, typ string, m Meta, object map[string]any) []byte {
	ev := map[string]any{
		"id":               id,
		"object":           "event",
		"api_version":      cmp.Or(m.APIVersion, APIVersion),
		"created":          m.Created,
		"livemode":         m.Livemode,
		"pending_webhooks": 1,
		"request":          map[string]any{"id": nil, "idempotency_key": nil},
		"type":             typ,
		"data":             map[string]any{"object": object},
	}
	if m.Account != "" {
		ev["account"] = m.Account
	}
	b, err := json.Marshal(ev)
	if err != nil {
		panic(err) // only maps of JSON values reach here
	}
	return b
}

// Invoice is an invoice object in the given status.
func Invoice(id, customer, status string, amount int64) map[string]any {
	paid := int64(0)
	if status == "paid" {
		paid = amount
	}
	return map[string]any{
		"id": id, "object": "invoice", "customer": customer, "status": status,
		"currency": "usd", "amount_due": amount, "amount_paid": paid,
	}
}

// ChargeWithRefunds is a charge for invoice with its refund list expanded;
// every refund has succeeded.
func ChargeWithRefunds(id, invoice string, refunds map[string]int64) map[string]any {
	var list []map[string]any
	for rid, amt := range refunds {
		list = append(list, RefundIn(rid, id, "succeeded", amt))
	}
	return ChargeWithRefundList(id, invoice, list...)
}

// ChargeWithRefundList is a charge for invoice (none if "") with the given
// refunds (see RefundIn) in its expanded refund list.
func ChargeWithRefundList(id, invoice string, refunds ...map[string]any) map[string]any {
	data := []map[string]any{}
	data = append(data, refunds...)
	ch := map[string]any{
		"id": id, "object": "charge", "currency": "usd", "refunded": true,
		"refunds": map[string]any{"object": "list", "data": data},
	}
	if invoice != "" {
		ch["invoice"] = invoice
	}
	return ch
}

// Refund is a refund object that has succeeded.
func Refund(id, charge string, amount int64) map[string]any {
	return RefundIn(id, charge, "succeeded", amount)
}

// RefundIn is a refund object in the given status (pending,
// requires_action, succeeded, failed or canceled).
func RefundIn(id, charge, status string, amount int64) map[string]any {
	return map[string]any{"id": id, "object": "refund", "amount": amount, "currency": "usd", "charge": charge, "status": status}
}

// Sign returns a Stripe-Signature header for payload, signed at t with each
// secret (two during a roll), computed from Stripe's documented scheme:
// v1 = hex(HMAC-SHA256(secret, "<t>.<payload>")). It is written
// independently of stripe-go so that tests do not check the verifier against
// itself.
func Sign(payload []byte, t time.Time, secrets ...string) string {
	h := fmt.Sprintf("t=%d", t.Unix())
	for _, s := range secrets {
		mac := hmac.New(sha256.New, []byte(s))
		fmt.Fprintf(mac, "%d.", t.Unix())
		mac.Write(payload)
		h += ",v1=" + hex.EncodeToString(mac.Sum(nil))
	}
	return h
}
