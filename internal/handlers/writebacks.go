package handlers

import (
	"fmt"
	"slices"
	"strings"
)

// Write-backs: calls to the Stripe API a booking asks for (docs/writebacks.md).
// A handler never calls Stripe itself (it may run more than once for one
// receipt, see DB); it records an intent in writeback_intents in the same
// statement as the booking, and internal/writeback sends it once the
// transaction has committed.

// WritebackCustomerMetadata is the sample write-back: after a payment is
// newly booked, set metadata[LastPaidInvoiceKey] to the invoice's id on the
// invoice's customer (POST /v1/customers/{id}). WRITEBACKS=customer_metadata
// turns it on.
const WritebackCustomerMetadata = "customer_metadata"

// LastPaidInvoiceKey is the customer metadata key the sample write-back sets.
const LastPaidInvoiceKey = "inbox_last_paid_invoice"

// customerMetadataKeySQL is the sample write-back's Idempotency-Key, in SQL
// over payInvoice's $1 (the invoice): the kind and the booking's ledger key
// (invoice_id, kind 'payment', unique in ledger_entries). Stable across
// redeliveries, Event objects and processes; no personal data (Stripe's
// advice: https://docs.stripe.com/api/idempotent_requests); well under
// Stripe's 255 characters (an invoice id is about 30).
const customerMetadataKeySQL = `'inbox:` + WritebackCustomerMetadata + `:' || $1::text || ':payment'`

// CustomerMetadataKey is customerMetadataKeySQL in Go (tests, docs).
func CustomerMetadataKey(invoiceID string) string {
	return "inbox:" + WritebackCustomerMetadata + ":" + invoiceID + ":payment"
}

// knownWritebacks are the write-backs the code ships.
var knownWritebacks = []string{WritebackCustomerMetadata}

// ParseWritebacks reads WRITEBACKS: a comma-separated list of write-backs to
// turn on; "" or "off" turns them all off.
func ParseWritebacks(raw string) []string {
	raw = strings.TrimSpace(raw)
	if raw == "" || raw == "off" {
		return nil
	}
	var out []string
	for _, w := range strings.Split(raw, ",") {
		if w = strings.TrimSpace(w); w != "" && !slices.Contains(out, w) {
			out = append(out, w)
		}
	}
	return out
}

func (o Options) validateWritebacks() error {
	for _, w := range o.Writebacks {
		if !slices.Contains(knownWritebacks, w) {
			return fmt.Errorf("WRITEBACKS=%q: %q is not a write-back this release ships; use %q (after a payment is newly booked, set metadata[%s] on the invoice's customer) or off",
				strings.Join(o.Writebacks, ","), w, WritebackCustomerMetadata, LastPaidInvoiceKey)
		}
	}
	return nil
}

// WritebackOn reports whether write-back w is on.
func (o Options) WritebackOn(w string) bool { return slices.Contains(o.Writebacks, w) }
