//go:build linux

package e2e_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stripe-inbox/inbox/internal/pgtest"
)

// TestWebhookServesCachedSecretsWhileSecretsManagerStalls: when the signing
// secret's TTL has passed and Secrets Manager hangs, the refresh is
// abandoned by its own timeout (SECRET_FETCH_TIMEOUT), through the real SDK
// client, and every delivery is still verified with the cached secret and
// stored: none is answered 5xx, the function is not timed out and reset.
func TestWebhookServesCachedSecretsWhileSecretsManagerStalls(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	sm := newSecretStore(t, map[string]string{billingARN: "whsec_billing_e2e"})
	env := webhookEnv(db, sm, "billing="+billingARN, "10s") // the shortest SECRET_TTL
	env["SECRET_FETCH_TIMEOUT"] = "500ms"
	em := emulate(t, "webhook", env, 10*time.Second)

	wantAnswer(t, "before the stall", signed(t, em, "/billing", invoicePaid("evt_stall_0", "in_stall_0", 100), false, "whsec_billing_e2e"), 200, "stored")
	sm.stall(billingARN)

	// Deliver until a delivery's refresh has reached the stalled stand-in
	// and been abandoned; every delivery meanwhile must be stored.
	n := 0
	deliverOne := func() {
		n++
		id := fmt.Sprintf("evt_stall_%d", n)
		wantAnswer(t, id, signed(t, em, "/billing", invoicePaid(id, "in_"+id, 100), false, "whsec_billing_e2e"), 200, "stored")
	}
	guard := time.Now().Add(time.Minute) // a hang, not a measurement
	for sm.abandonedCalls(billingARN) == 0 {
		deliverOne()
		if time.Now().After(guard) {
			t.Fatalf("no refresh reached the stalled stand-in and was abandoned after %d deliveries", n)
		}
		sm.pause(100 * time.Millisecond)
	}
	// And after it, with the stand-in still stalled.
	for range 5 {
		deliverOne()
	}
	if got := db.Count(t, "webhook_inbox", ""); got != n+1 {
		t.Errorf("%d receipts, want %d", got, n+1)
	}
	waitLog(t, em, "signing secret refresh failed; using the cached value")
	waitLog(t, em, `"SecretRefreshFailed":1`)
	if c := coldStarts(em); c != 1 {
		t.Errorf("%d INIT phases, want 1: a stalled Secrets Manager must not get the instance reset", c)
	}
	t.Logf("%d deliveries stored while Secrets Manager was stalled; %d GetSecretValue calls, %d abandoned",
		n, sm.fetches(billingARN), sm.abandonedCalls(billingARN))
}

// TestWebhookColdStartWithStalledSecretsManager: with no cached secret (the
// first fetch, at the cold start, is abandoned by its timeout), a delivery
// is answered 503 at once so that Stripe retries, not left to hang until the
// function's timeout; once Secrets Manager answers again, the same instance
// fetches the secret and stores the retried delivery.
func TestWebhookColdStartWithStalledSecretsManager(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	sm := newSecretStore(t, map[string]string{billingARN: "whsec_billing_e2e"})
	sm.stall(billingARN)
	env := webhookEnv(db, sm, "billing="+billingARN, "1h")
	env["SECRET_FETCH_TIMEOUT"] = "500ms"
	em := emulate(t, "webhook", env, 10*time.Second)

	body := invoicePaid("evt_cold_stall", "in_cold_stall", 100)
	r := signed(t, em, "/billing", body, false, "whsec_billing_e2e")
	wantAnswer(t, "delivery without a secret", r, http.StatusServiceUnavailable, "")
	if n := db.Count(t, "webhook_inbox", ""); n != 0 {
		t.Errorf("%d receipts stored without a verified signature", n)
	}
	// The start's fetch and the delivery's were both given up by the SDK
	// client when their own timeouts ended.
	sm.waitFor(t, "two abandoned fetches", func() bool { return sm.abandonedCalls(billingARN) >= 2 })
	waitLog(t, em, "signing secret not fetched at start")
	waitLog(t, em, `"reason":"secret_unavailable"`)
	waitLog(t, em, `"SecretUnavailable":1`)

	sm.release(billingARN)
	wantAnswer(t, "Stripe's retry", signed(t, em, "/billing", body, false, "whsec_billing_e2e"), 200, "stored")
	if c := coldStarts(em); c != 1 {
		t.Errorf("%d INIT phases, want 1", c)
	}
}
