//go:build linux

package e2e_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stripe-inbox/inbox/e2e"
	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/stripetest"
)

// workerEnv is the environment the CDK stack gives the worker, with the
// test's database, and a deadline margin (and statement timeout) scaled
// down to the emulator's 20s timeout. POLL_INTERVAL=0: these invocations
// return once the inbox is empty (the scheduled-only worker), so that each
// takes a moment; TestResidentWorkerBinary runs it resident, as the stack
// does.
func workerEnv(db *pgtest.Database) map[string]string {
	return map[string]string{
		"POLL_INTERVAL":      "0",
		"DATABASE_URL":       db.URL,
		"STRIPE_MODE":        "test",
		"WORKER_CONCURRENCY": "4",
		"MAX_ATTEMPTS":       "10",
		"LEASE":              "2m",
		"STATEMENT_TIMEOUT":  "2s",
		"DEADLINE_MARGIN":    "3s",
		"DB_MAX_CONNS":       "5",
		"METRICS_NAMESPACE":  "StripeInboxE2E",
		"METRICS_DIMENSIONS": "Stage=e2e",
		"AWS_REGION":         "us-east-1",
	}
}

// purgeEnv is the environment the CDK stack gives the purge, with the test's
// database and a batch of one row, so that batching runs.
func purgeEnv(db *pgtest.Database) map[string]string {
	return map[string]string{
		"DATABASE_URL":             db.URL,
		"RETENTION_DAYS":           "30",
		"PURGE_BATCH_SIZE":         "1",
		"SCRUB_PAYLOAD_AFTER_DAYS": "0",
		"DEADLINE_MARGIN":          "3s",
		"METRICS_NAMESPACE":        "StripeInboxE2E",
		"METRICS_DIMENSIONS":       "Stage=e2e",
		"AWS_REGION":               "us-east-1",
	}
}

// scheduledEvent is the event an EventBridge schedule rule sends.
func scheduledEvent(function string) []byte {
	b, err := json.Marshal(map[string]any{
		"version":     "0",
		"id":          randomHex(4) + "-" + randomHex(2) + "-" + randomHex(2) + "-" + randomHex(2) + "-" + randomHex(6),
		"detail-type": "Scheduled Event",
		"source":      "aws.events",
		"account":     "000000000000",
		"time":        time.Now().UTC().Format(time.RFC3339),
		"region":      "us-east-1",
		"resources":   []string{"arn:aws:events:us-east-1:000000000000:rule/inbox-" + function + "-schedule"},
		"detail":      map[string]any{},
	})
	if err != nil {
		panic(err)
	}
	return b
}

// workerSummary is the worker's answer, as JSON.
type workerSummary struct {
	Processed   *int `json:"processed"`
	Ignored     *int `json:"ignored"`
	Failed      *int `json:"failed"`
	Remaining   *int `json:"remaining"`
	NeedsReview *int `json:"needs_review"`
}

// runWorker invokes the worker with a scheduled event and decodes its
// summary.
func runWorker(t *testing.T, em *e2e.Emulator) workerSummary {
	t.Helper()
	resp := invoke(t, em, scheduledEvent("worker"))
	if resp.Status != http.StatusOK {
		t.Fatalf("worker invoke answered HTTP %d: %s", resp.Status, resp.Body)
	}
	var s workerSummary
	if err := json.Unmarshal(resp.Body, &s); err != nil {
		t.Fatalf("worker answer %s is not its JSON summary: %v", resp.Body, err)
	}
	if s.Processed == nil || s.Ignored == nil || s.Failed == nil || s.Remaining == nil || s.NeedsReview == nil {
		t.Fatalf("worker answer %s lacks summary fields (processed, ignored, failed, remaining, needs_review)", resp.Body)
	}
	return s
}

// TestWorkerDrains: deliveries received by the webhook binary are drained
// by the worker binary, invoked as the EventBridge schedule does: the
// payment is booked once and the receipts are marked processed.
func TestWorkerDrains(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	sm := newSecretStore(t, map[string]string{billingARN: "whsec_billing_e2e"})
	hook := emulate(t, "webhook", webhookEnv(db, sm, "billing="+billingARN, "1h"), 10*time.Second)
	work := emulate(t, "worker", workerEnv(db), 20*time.Second)

	paid := invoicePaid("evt_drain_paid", "in_drain_1", 4200)
	wantAnswer(t, "invoice.paid", signed(t, hook, "/billing", paid, false, "whsec_billing_e2e"), 200, "stored")
	other := stripetest.Event("evt_drain_customer", "customer.created", map[string]any{"id": "cus_drain", "object": "customer"})
	wantAnswer(t, "customer.created", signed(t, hook, "/billing", other, true, "whsec_billing_e2e"), 200, "stored")

	s := runWorker(t, work)
	if *s.Processed != 1 || *s.Ignored != 1 || *s.Failed != 0 || *s.Remaining != 0 || *s.NeedsReview != 0 {
		t.Errorf("first run: summary %+v, want processed 1, ignored 1, failed 0, remaining 0, needs_review 0", fmtSummary(s))
	}
	if n := db.Count(t, "ledger_entries", "invoice_id = 'in_drain_1' AND kind = 'payment' AND amount = 4200 AND event_id = 'evt_drain_paid'"); n != 1 {
		t.Errorf("%d ledger entries for the payment of in_drain_1, want 1", n)
	}
	if n := db.Count(t, "invoices", "id = 'in_drain_1' AND status = 'paid'"); n != 1 {
		t.Errorf("invoice in_drain_1 is not paid")
	}
	if n := db.Count(t, "webhook_inbox", "event_id = 'evt_drain_paid' AND processed_at IS NOT NULL AND outcome = 'applied'"); n != 1 {
		t.Errorf("evt_drain_paid is not marked processed (applied)")
	}
	if n := db.Count(t, "webhook_inbox", "event_id = 'evt_drain_customer' AND processed_at IS NOT NULL AND outcome = 'ignored'"); n != 1 {
		t.Errorf("evt_drain_customer is not marked processed (ignored)")
	}

	// The next scheduled run finds nothing, books nothing twice, and reuses
	// the warm function.
	s = runWorker(t, work)
	if *s.Processed != 0 || *s.Ignored != 0 || *s.Failed != 0 || *s.Remaining != 0 {
		t.Errorf("second run: summary %+v, want nothing done and nothing remaining", fmtSummary(s))
	}
	if n := db.Count(t, "ledger_entries", ""); n != 1 {
		t.Errorf("%d ledger entries after two runs, want 1", n)
	}
	if n := coldStarts(work); n != 1 {
		t.Errorf("worker ran %d INIT phases over two invokes, want 1", n)
	}
	waitLog(t, work, `"msg":"worker run"`)
}

func fmtSummary(s workerSummary) map[string]int {
	v := func(p *int) int {
		if p == nil {
			return -1
		}
		return *p
	}
	return map[string]int{"processed": v(s.Processed), "ignored": v(s.Ignored), "failed": v(s.Failed), "remaining": v(s.Remaining), "needs_review": v(s.NeedsReview)}
}

// TestPurge: the purge binary, invoked as the daily schedule does, deletes
// processed receipts and published outbox rows past the retention, in
// batches, and nothing else.
func TestPurge(t *testing.T) {
	t.Parallel()
	setup(t).binary(t, "purge")
	db := pgtest.DB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Ad-hoc fixtures: receipts and outbox rows of every age and state.
	_, err := db.Pool.Exec(ctx, `
INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, payload, received_at, available_at, processed_at, outcome)
VALUES ('stripe', 'billing', 'evt_old_done', 'invoice.paid', false, '{}', now() - interval '40 days', now() - interval '40 days', now() - interval '40 days', 'applied'),
       ('stripe', 'billing', 'evt_old_done_2', 'invoice.paid', false, '{}', now() - interval '35 days', now() - interval '35 days', now() - interval '31 days', 'ignored'),
       ('stripe', 'billing', 'evt_recent_done', 'invoice.paid', false, '{}', now() - interval '2 days', now() - interval '2 days', now() - interval '2 days', 'applied'),
       ('stripe', 'billing', 'evt_old_pending', 'invoice.paid', false, '{}', now() - interval '90 days', now() - interval '90 days', NULL, NULL);
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at, published_at)
VALUES ('invoice', 'in_1', 'invoice.paid', '{}', now() - interval '40 days', now() - interval '40 days'),
       ('invoice', 'in_2', 'invoice.paid', '{}', now() - interval '2 days', now() - interval '2 days'),
       ('invoice', 'in_3', 'invoice.paid', '{}', now() - interval '90 days', NULL);`)
	if err != nil {
		t.Fatal(err)
	}

	em := emulate(t, "purge", purgeEnv(db), 30*time.Second)
	resp := invoke(t, em, scheduledEvent("purge"))
	if resp.Status != http.StatusOK {
		t.Fatalf("purge invoke answered HTTP %d: %s", resp.Status, resp.Body)
	}
	var s struct {
		PurgedReceipts    *int64 `json:"purged_receipts"`
		PurgedOutbox      *int64 `json:"purged_outbox"`
		Batches           *int   `json:"batches"`
		StoppedAtDeadline *bool  `json:"stopped_at_deadline"`
		ErrorMessage      string `json:"errorMessage"`
	}
	if err := json.Unmarshal(resp.Body, &s); err != nil || s.ErrorMessage != "" {
		t.Fatalf("purge answer %s is not its JSON summary (err %v)", resp.Body, err)
	}
	if s.PurgedReceipts == nil || s.PurgedOutbox == nil || s.Batches == nil || s.StoppedAtDeadline == nil {
		t.Fatalf("purge answer %s lacks summary fields", resp.Body)
	}
	if *s.PurgedReceipts != 2 || *s.PurgedOutbox != 1 || *s.Batches != 3 || *s.StoppedAtDeadline {
		t.Errorf("summary %s, want purged_receipts 2, purged_outbox 1, batches 3 (batch size 1), not stopped at the deadline", resp.Body)
	}
	if n := db.Count(t, "webhook_inbox", "event_id IN ('evt_old_done', 'evt_old_done_2')"); n != 0 {
		t.Errorf("%d processed receipts past the retention left, want 0", n)
	}
	if n := db.Count(t, "webhook_inbox", "event_id IN ('evt_recent_done', 'evt_old_pending')"); n != 2 {
		t.Errorf("%d of the recent and the unprocessed receipts left, want both", n)
	}
	if n := db.Count(t, "outbox", ""); n != 2 {
		t.Errorf("%d outbox rows left, want 2 (the recent and the unpublished)", n)
	}
	waitLog(t, em, `"msg":"purge"`)
}

// TestTextJSONBRefusesIsStoredAndDrained: verified deliveries whose customer
// text PostgreSQL's jsonb refuses (an escaped NUL, a lone surrogate) are
// stored by the webhook binary with their exact bytes and drained by the
// worker binary like any other.
func TestTextJSONBRefusesIsStoredAndDrained(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	sm := newSecretStore(t, map[string]string{billingARN: "whsec_billing_e2e"})
	hook := emulate(t, "webhook", webhookEnv(db, sm, "billing="+billingARN, "1h"), 10*time.Second)
	work := emulate(t, "worker", workerEnv(db), 20*time.Second)

	bodies := map[string][]byte{}
	for id, name := range map[string]string{"evt_text_nul": `Ann\u0000Lee`, "evt_text_surrogate": `cut \ud83d emoji`} {
		body := invoicePaid(id, "in_"+id, 1200)
		body = []byte(strings.Replace(string(body), `"customer":"cus_e2e"`, `"customer":"cus_e2e","customer_name":"`+name+`"`, 1))
		if !strings.Contains(string(body), name) {
			t.Fatalf("%s: customer_name not inserted into %s", id, body)
		}
		bodies[id] = body
		wantAnswer(t, id, signed(t, hook, "/billing", body, false, "whsec_billing_e2e"), 200, "stored")
		wantAnswer(t, id+" redelivered", signed(t, hook, "/billing", body, true, "whsec_billing_e2e"), 200, "duplicate")
	}
	for id, body := range bodies {
		if n := db.Count(t, "webhook_inbox", "event_id = $1 AND payload_raw = $2 AND payload->>'id' = $1", id, body); n != 1 {
			t.Errorf("%s: the exact bytes are not in payload_raw", id)
		}
	}
	s := runWorker(t, work)
	if *s.Processed != 2 || *s.Failed != 0 || *s.Remaining != 0 {
		t.Errorf("summary %+v, want processed 2, failed 0, remaining 0", fmtSummary(s))
	}
	for id := range bodies {
		if n := db.Count(t, "invoices", "id = $1 AND status = 'paid'", "in_"+id); n != 1 {
			t.Errorf("%s: invoice not paid", id)
		}
		if n := db.Count(t, "webhook_inbox", "event_id = $1 AND outcome = 'applied'", id); n != 1 {
			t.Errorf("%s: not processed", id)
		}
	}
}

// TestResidentWorkerBinary: the worker binary as the stack runs it
// (POLL_INTERVAL=250ms; here with LISTEN, and the webhook with NOTIFY) stays
// in its invocation once the inbox is empty, processes a receipt the webhook
// binary stores meanwhile, and returns on its own before the invocation's
// timeout, at the deadline margin.
func TestResidentWorkerBinary(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	sm := newSecretStore(t, map[string]string{billingARN: "whsec_billing_e2e"})
	henv := webhookEnv(db, sm, "billing="+billingARN, "1h")
	henv["NOTIFY"] = "on"
	hook := emulate(t, "webhook", henv, 10*time.Second)
	wenv := workerEnv(db)
	wenv["POLL_INTERVAL"] = "250ms"
	wenv["LISTEN"] = "on"
	work := emulate(t, "worker", wenv, 20*time.Second)

	type result struct {
		resp e2e.Response
		err  error
	}
	done := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		resp, err := work.Invoke(ctx, scheduledEvent("worker"))
		done <- result{resp, err}
	}()
	waitLog(t, work, `"msg":"worker resident"`)
	wantAnswer(t, "invoice.paid", signed(t, hook, "/billing", invoicePaid("evt_resident", "in_resident", 700), false, "whsec_billing_e2e"), 200, "stored")
	db.WaitUntil(t, "the receipt is processed within the running invocation",
		"SELECT count(*) = 1 FROM webhook_inbox WHERE event_id = 'evt_resident' AND processed_at IS NOT NULL")
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.resp.Status != 200 {
		t.Fatalf("worker invoke answered HTTP %d: %s", r.resp.Status, r.resp.Body)
	}
	var s workerSummary
	if err := json.Unmarshal(r.resp.Body, &s); err != nil || s.Processed == nil {
		t.Fatalf("worker answer %s is not its JSON summary (a timeout?): %v", r.resp.Body, err)
	}
	if *s.Processed != 1 || *s.Remaining != 0 {
		t.Errorf("summary %+v, want processed 1, remaining 0", fmtSummary(s))
	}
	if n := db.Count(t, "ledger_entries", "invoice_id = 'in_resident'"); n != 1 {
		t.Errorf("%d ledger entries for in_resident, want 1", n)
	}
	waitLog(t, work, `"msg":"worker resident stopped"`)
}
