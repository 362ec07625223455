//go:build linux

package e2e_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stripe-inbox/inbox/internal/invokeproof"
	"github.com/stripe-inbox/inbox/internal/invokeproof/ststest"
	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/stripeapitest"
	"github.com/stripe-inbox/inbox/internal/writeback"
)

// The writeback function's role, as the stand-in STS reports the
// environment's fake credentials and as the store admits it
// (WRITEBACK_ROLE_ARN).
const writebackRole = "e2e-writeback-role"

var writebackPrincipal = callerPrincipal(writebackRole, "inbox-writeback", "AROAE2EWRITEBACK:inbox-writeback")

func provenWritebackRequest(t *testing.T, sts *ststest.Server, who ststest.Principal, audience string, req writeback.StoreRequest, at time.Time) []byte {
	t.Helper()
	return provenRequest(t, sts, who, audience, req, at)
}

// TestWritebackStoreFunction: the in-VPC write-back store's binary, under
// the Lambda runtime interface emulator, refuses a developer's request, a
// proof for the reconciler's store, a swapped request, one without a proof
// and a replay, claiming nothing; then serves the sender's claim and
// backlog read. Each refusal is counted; none crashes the function.
func TestWritebackStoreFunction(t *testing.T) {
	t.Parallel()
	setup(t).binary(t, "writebackstore")
	db := pgtest.DB(t)
	developer := ststest.RoleSession("Developer", "dev@example.com", "ASIAE2EDEVELOPER")
	sts := ststest.New(t, writebackPrincipal, developer)
	em := emulate(t, "writebackstore", storeFunctionEnv(db, sts, "WRITEBACK_ROLE_ARN", writebackRole, nil), 20*time.Second)
	if _, err := db.Pool.Exec(context.Background(), `
INSERT INTO writeback_intents (kind, target, params, idempotency_key, event_id)
VALUES ('customer_metadata', 'cus_1', '{"metadata": {"k": "v"}}', 'inbox:customer_metadata:in_1:payment', 'evt_1')`); err != nil {
		t.Fatal(err)
	}
	claim := writeback.StoreRequest{Op: writeback.OpClaim, Limit: 10, Lease: time.Minute, KeyLifetime: writeback.KeyLifetime}
	refused := func(what string, payload []byte, reason string) {
		t.Helper()
		resp := invoke(t, em, payload)
		if !strings.Contains(string(resp.Body), "refused: the request is not proven to come from the write-back sender ("+reason+")") {
			t.Fatalf("%s: answered %d %s, want a refusal (%s)", what, resp.Status, resp.Body, reason)
		}
	}
	refused("a developer's request", provenWritebackRequest(t, sts, developer, writeback.StoreAudience, claim, time.Now()), "principal")

	var env invokeproof.Envelope
	if err := json.Unmarshal(provenWritebackRequest(t, sts, writebackPrincipal, writeback.StoreAudience, writeback.StoreRequest{Op: writeback.OpBacklog}, time.Now()), &env); err != nil {
		t.Fatal(err)
	}
	swapped, _ := json.Marshal(claim)
	forged, _ := json.Marshal(invokeproof.Envelope{Payload: swapped, Proof: env.Proof})
	refused("the sender's proof over another request", forged, "forged")
	refused("a request without a proof", swapped, "missing")
	refused("a replayed request", provenWritebackRequest(t, sts, writebackPrincipal, writeback.StoreAudience, claim, time.Now().Add(-10*time.Minute)), "stale")
	resp := invoke(t, em, provenWritebackRequest(t, sts, writebackPrincipal, "reconcilestore", claim, time.Now()))
	if !strings.Contains(string(resp.Body), "refused: the request is not proven to come from the write-back sender") {
		t.Fatalf("a proof for the reconciler's store: answered %d %s", resp.Status, resp.Body)
	}
	if n := db.Count(t, "writeback_intents", "attempts = 0 AND claim_token IS NULL"); n != 1 {
		t.Fatalf("a refused request claimed the intent")
	}

	resp = invoke(t, em, provenWritebackRequest(t, sts, writebackPrincipal, writeback.StoreAudience, claim, time.Now()))
	var got writeback.StoreResponse
	if resp.Status != 200 || json.Unmarshal(resp.Body, &got) != nil || got.Token == "" || len(got.Intents) != 1 {
		t.Fatalf("the sender's claim: answered %d %s", resp.Status, resp.Body)
	}
	if n := db.Count(t, "writeback_intents", "attempts = 1 AND claim_token IS NOT NULL"); n != 1 {
		t.Fatalf("the claim is not in the database")
	}
	valid, _ := json.Marshal(env)
	resp = invoke(t, em, valid)
	if resp.Status != 200 || json.Unmarshal(resp.Body, &got) != nil || got.Backlog == nil || got.Backlog.Pending != 1 {
		t.Fatalf("the sender's backlog read: answered %d %s", resp.Status, resp.Body)
	}
	waitLog(t, em, `"InvokeProofRefused":1`)
	for _, reason := range []string{"principal", "forged", "missing", "stale"} {
		waitLog(t, em, `"Reason":"`+reason+`"`)
	}
	if coldStarts(em) != 1 {
		t.Errorf("%d cold starts: a refusal must not crash the function", coldStarts(em))
	}
}

// TestWritebackSenderSendsThroughTheStoreFunction: the writeback binary
// (outside the VPC in AWS) claims through the writebackstore binary with
// the real Lambda client (AWS_ENDPOINT_URL_LAMBDA points at the store's
// emulator), each request proven with its credentials, calls the Stripe
// stand-in once, records the result, and emits the backlog's gauges; a
// second run calls nothing.
func TestWritebackSenderSendsThroughTheStoreFunction(t *testing.T) {
	t.Parallel()
	setup(t).binary(t, "writeback")
	setup(t).binary(t, "writebackstore")
	db := pgtest.DB(t)
	sts := ststest.New(t, writebackPrincipal)
	store := emulate(t, "writebackstore", storeFunctionEnv(db, sts, "WRITEBACK_ROLE_ARN", writebackRole, nil), 20*time.Second)
	api := stripeapitest.New("cus_1")
	t.Cleanup(api.Close)
	if _, err := db.Pool.Exec(context.Background(), `
INSERT INTO writeback_intents (kind, target, params, idempotency_key, event_id)
VALUES ('customer_metadata', 'cus_1', '{"metadata": {"inbox_last_paid_invoice": "in_1"}}', 'inbox:customer_metadata:in_1:payment', 'evt_1')`); err != nil {
		t.Fatal(err)
	}
	sender := emulate(t, "writeback", callerEnv(t, store, sts, map[string]string{
		"STRIPE_API_KEY":  stripeapitest.Key, // the stand-in's; in AWS a restricted key from Secrets Manager
		"STRIPE_API_BASE": api.URL,
	}), 20*time.Second)

	resp := invoke(t, sender, scheduledEvent("writeback"))
	var sum writeback.Summary
	if resp.Status != 200 || json.Unmarshal(resp.Body, &sum) != nil || sum.Calls != 1 || sum.Done != 1 {
		t.Fatalf("the sender's run: answered %d %s", resp.Status, resp.Body)
	}
	if n := api.Applied("inbox:customer_metadata:in_1:payment"); n != 1 {
		t.Fatalf("applied %d times, want 1", n)
	}
	if n := db.Count(t, "writeback_intents", "status = 'done' AND result_via = 'call'"); n != 1 {
		t.Fatalf("the result is not recorded")
	}
	waitLog(t, sender, `"WritebacksPending":0`)
	resp = invoke(t, sender, scheduledEvent("writeback"))
	if resp.Status != 200 || json.Unmarshal(resp.Body, &sum) != nil || sum.Calls != 0 {
		t.Fatalf("the second run: answered %d %s", resp.Status, resp.Body)
	}
}
