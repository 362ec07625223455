//go:build linux

package e2e_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stripe-inbox/inbox/internal/eventbridgetest"
	"github.com/stripe-inbox/inbox/internal/pgtest"
)

// TestWorkerRelaysTheOutbox: the worker binary, configured as the stack
// configures it plus OUTBOX_BUS, and pointed at an EventBridge stand-in by
// the AWS SDK's usual settings (AWS_ENDPOINT_URL_EVENTBRIDGE, AWS_REGION,
// static credentials), books a payment and publishes its outbox row in the
// same invocation, with the row's id in the detail, and marks it published.
func TestWorkerRelaysTheOutbox(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	eb := eventbridgetest.New(t, "StripeInbox-e2e-outbox")
	sm := newSecretStore(t, map[string]string{billingARN: "whsec_billing_e2e"})
	hook := emulate(t, "webhook", webhookEnv(db, sm, "billing="+billingARN, "1h"), 10*time.Second)
	env := workerEnv(db)
	env["OUTBOX_BUS"] = "StripeInbox-e2e-outbox"
	for _, kv := range eb.Env() {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	work := emulate(t, "worker", env, 20*time.Second)

	wantAnswer(t, "invoice.paid", signed(t, hook, "/billing", invoicePaid("evt_relay_paid", "in_relay_1", 4200), false, "whsec_billing_e2e"), 200, "stored")
	resp := invoke(t, work, scheduledEvent("worker"))
	var s struct {
		Processed       int `json:"processed"`
		OutboxPublished int `json:"outbox_published"`
	}
	if err := json.Unmarshal(resp.Body, &s); err != nil || s.Processed != 1 || s.OutboxPublished != 1 {
		t.Fatalf("worker answered %s (err %v), want processed 1 and outbox_published 1", resp.Body, err)
	}
	events := eb.Events()
	if len(events) != 1 {
		t.Fatalf("the stand-in accepted %d entries, want 1", len(events))
	}
	var id int64
	if err := db.Pool.QueryRow(t.Context(), "SELECT id FROM outbox WHERE aggregate_id = 'in_relay_1' AND published_at IS NOT NULL").Scan(&id); err != nil {
		t.Fatalf("the outbox row is not marked published: %v", err)
	}
	e := events[0]
	if e.Bus != "StripeInbox-e2e-outbox" || e.Source != "stripe-inbox" || e.DetailType != "InvoicePaymentBooked" || e.OutboxID() != id {
		t.Errorf("entry %+v (detail %s), want bus StripeInbox-e2e-outbox, source stripe-inbox, InvoicePaymentBooked, outbox_id %d", e, e.Detail, id)
	}
	if !strings.Contains(string(e.Detail), `"invoice_id":"in_relay_1"`) {
		t.Errorf("detail %s lacks the payload", e.Detail)
	}
	waitLog(t, work, `"OutboxPublished":1`)
}
