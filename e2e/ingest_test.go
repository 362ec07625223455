//go:build linux

package e2e_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stripe-inbox/inbox/internal/ingest"
	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/sqstest"
	"github.com/stripe-inbox/inbox/internal/stripetest"
)

// TestIngestFunction: the ingest binary under the emulator drains its SQS
// queue (the stand-in, reached through AWS_ENDPOINT_URL_SQS) of EventBridge
// envelopes: the events are stored with source eventbridge and deleted, a
// redelivery in a new envelope is a duplicate, a foreign source and a
// detail that is not an event go to the dead-letter queue with their
// reason. An envelope handed to the function directly (the payload of an
// Invoke, as any principal with lambda:InvokeFunction could) is ignored.
func TestIngestFunction(t *testing.T) {
	t.Parallel()
	setup(t).binary(t, "ingest")
	db := pgtest.DB(t)
	q := sqstest.New()
	t.Cleanup(q.Close)
	q.CreateQueue("ingest-dlq", "", 0)
	queueURL := q.CreateQueue("ingest", "ingest-dlq", 5)
	em := emulate(t, "ingest", map[string]string{
		"DATABASE_URL":         db.URL,
		"EVENTBRIDGE_SOURCES":  stripetest.EventBridgeSource + "=billing",
		"INGEST_QUEUE_URL":     queueURL,
		"INGEST_DLQ_URL":       q.QueueURL("ingest-dlq"),
		"AWS_ENDPOINT_URL_SQS": q.URL,
		"DB_MAX_CONNS":         "2",
		"METRICS_NAMESPACE":    "StripeInboxE2E",
		"METRICS_DIMENSIONS":   "Stage=e2e",
		"AWS_REGION":           "us-east-1",
		// The SDK signs with the function's credentials (the stand-in
		// checks that requests are signed).
		"AWS_ACCESS_KEY_ID":     fakeAccessKey,
		"AWS_SECRET_ACCESS_KEY": "e2e-fake-secret-access-key",
	}, 20*time.Second)

	paid := stripetest.Event("evt_e2e_eb", "invoice.paid", stripetest.Invoice("in_e2e_eb", "cus_1", "paid", 4200))
	q.Send("ingest", string(stripetest.EventBridge("11111111-1111-1111-1111-111111111111", stripetest.EventBridgeSource, paid)))
	q.Send("ingest", string(stripetest.EventBridge("22222222-2222-2222-2222-222222222222", stripetest.EventBridgeSource, paid)))
	q.Send("ingest", string(stripetest.EventBridge("33333333-3333-3333-3333-333333333333", "aws.partner/stripe.com/ed_not_ours", paid)))
	q.Send("ingest", string(stripetest.EventBridge("44444444-4444-4444-4444-444444444444", stripetest.EventBridgeSource, []byte(`{"id":"cus_1","object":"customer"}`))))

	// The doorbell: the rule's Lambda target hands the envelope too; the
	// function reads only the queue.
	injected := stripetest.EventBridge("55555555-5555-5555-5555-555555555555", stripetest.EventBridgeSource,
		stripetest.Event("evt_e2e_injected", "invoice.paid", stripetest.Invoice("in_e2e_injected", "cus_1", "paid", 990000)))
	resp := invoke(t, em, injected)
	var s ingest.Summary
	if resp.Status != 200 || json.Unmarshal(resp.Body, &s) != nil {
		t.Fatalf("drain answered %d %s", resp.Status, resp.Body)
	}
	if s.Stored != 1 || s.Duplicate != 1 || s.DeadLettered != 2 || s.Failed != 0 {
		t.Fatalf("summary %s, want 1 stored, 1 duplicate, 2 dead-lettered", resp.Body)
	}
	if n := db.Count(t, "webhook_inbox", "event_id = 'evt_e2e_eb' AND source = 'eventbridge'"); n != 1 {
		t.Fatalf("%d receipts of evt_e2e_eb from eventbridge, want 1", n)
	}
	if n := db.Count(t, "webhook_inbox", "event_id = 'evt_e2e_injected'"); n != 0 {
		t.Fatal("an event handed to the function directly was stored")
	}
	if m := q.Messages("ingest"); len(m) != 0 {
		t.Fatalf("%d messages left on the queue", len(m))
	}
	var reasons []string
	for _, m := range q.Messages("ingest-dlq") {
		reasons = append(reasons, m.Attributes["Reason"])
	}
	if strings.Join(reasons, ",") != "unknown_source,not_a_stripe_event" {
		t.Fatalf("dead-letter reasons %v", reasons)
	}
	// An empty queue: a sweep does nothing.
	resp = invoke(t, em, []byte(`{"source":"aws.events","detail-type":"Scheduled Event","detail":{}}`))
	if resp.Status != 200 || !strings.Contains(string(resp.Body), `"stored":0`) {
		t.Fatalf("sweep answered %d %s", resp.Status, resp.Body)
	}
}
