package stripetest

import (
	"encoding/json"
	"fmt"
)

// EventBridgeSource is a Stripe partner event source, as Stripe names it
// after an event destination (https://docs.stripe.com/event-destinations/eventbridge).
const EventBridgeSource = "aws.partner/stripe.com/ed_test_61RM8ltWcTW4mbsxf16RJyfa2xSQLHJJh1sxm7H0KVT6"

// EventBridge wraps a Stripe event (detail) in the envelope EventBridge
// hands a rule's target
// (https://docs.aws.amazon.com/eventbridge/latest/ref/overiew-event-structure.html).
// envelopeID is EventBridge's own id: a redelivery of the same event
// through another envelope has another one.
func EventBridge(envelopeID, source string, detail []byte) []byte {
	var head struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal(detail, &head)
	b, err := json.Marshal(map[string]any{
		"version":     "0",
		"id":          envelopeID,
		"detail-type": head.Type,
		"source":      source,
		"account":     "123456789012",
		"time":        "2026-12-02T00:00:00Z",
		"region":      "eu-west-1",
		"resources":   []string{"arn:aws:events:eu-west-1::event-source/" + source},
		"detail":      json.RawMessage(detail),
	})
	if err != nil {
		panic(fmt.Sprintf("stripetest.EventBridge: %v", err))
	}
	return b
}

// ThinEvent is a v2 thin notification (object "v2.core.event") about the
// related object relatedID of type relatedType: what a thin event
// destination delivers (https://docs.stripe.com/api/v2/events; stripe-go's
// ThinEvent).
func ThinEvent(id, typ, relatedID, relatedType string) []byte {
	b, err := json.Marshal(map[string]any{
		"id":       id,
		"object":   "v2.core.event",
		"type":     typ,
		"livemode": false,
		"created":  "2026-12-02T00:00:00.000Z",
		"related_object": map[string]any{
			"id":   relatedID,
			"type": relatedType,
			"url":  "/v1/" + relatedType + "s/" + relatedID,
		},
		"reason": map[string]any{"type": "request", "request": map[string]any{"id": "req_test_1", "idempotency_key": ""}},
	})
	if err != nil {
		panic(fmt.Sprintf("stripetest.ThinEvent: %v", err))
	}
	return b
}
