// Package stripetest builds Stripe-shaped events and signs them the way
// Stripe does, for tests, the local sample sender, benchmarks and the load
// generator. It is never used on a request path.
package stripetest

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"
)

// APIVersion is the version the generated events claim.
const APIVersion = "2025-03-31.basil"

// Event returns the JSON of a Stripe event of type typ about object.
func Event(id, typ string, object map[string]any) []byte {
	b, err := json.Marshal(map[string]any{
		"id":               id,
		"object":           "event",
		"api_version":      APIVersion,
		"created":          1764633600,
		"livemode":         false,
		"pending_webhooks": 1,
		"request":          map[string]any{"id": nil, "idempotency_key": nil},
		"type":             typ,
		"data":             map[string]any{"object": object},
	})
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

// ChargeWithRefunds is a charge for invoice with its refund list expanded.
func ChargeWithRefunds(id, invoice string, refunds map[string]int64) map[string]any {
	data := []map[string]any{}
	for rid, amt := range refunds {
		data = append(data, map[string]any{"id": rid, "object": "refund", "amount": amt, "currency": "usd", "charge": id})
	}
	return map[string]any{
		"id": id, "object": "charge", "invoice": invoice, "currency": "usd", "refunded": true,
		"refunds": map[string]any{"object": "list", "data": data},
	}
}

// Refund is a refund object.
func Refund(id, charge string, amount int64) map[string]any {
	return map[string]any{"id": id, "object": "refund", "amount": amount, "currency": "usd", "charge": charge}
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
