//go:build linux

package e2e_test

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/reconcile"
	"github.com/stripe-inbox/inbox/internal/reconcile/fakeapi"
	"github.com/stripe-inbox/inbox/internal/stripetest"
)

// storeEnv is the environment the CDK stack gives the reconciler's store
// function, with the test's database.
func storeEnv(db *pgtest.Database) map[string]string {
	return map[string]string{
		"DATABASE_URL":        db.URL,
		"RECONCILE_ENDPOINTS": "billing",
		"DB_MAX_CONNS":        "2",
		"METRICS_NAMESPACE":   "StripeInboxE2E",
		"METRICS_DIMENSIONS":  "Stage=e2e",
		"AWS_REGION":          "us-east-1",
	}
}

func storeRequest(t *testing.T, req reconcile.StoreRequest) []byte {
	t.Helper()
	b, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestReconcileStoreFunction: the in-VPC store function's binary, invoked
// as the reconciler invokes it, stores a page of events as receipts (source
// reconcile), counts a second delivery of the page as already present, keeps
// the high-water mark, and refuses an endpoint it does not reconcile.
func TestReconcileStoreFunction(t *testing.T) {
	t.Parallel()
	setup(t).binary(t, "reconcilestore")
	db := pgtest.DB(t)
	em := emulate(t, "reconcilestore", storeEnv(db), 20*time.Second)

	var page []json.RawMessage
	for i := range 3 {
		page = append(page, stripetest.Event(fmt.Sprintf("evt_page_%d", i), "invoice.paid", stripetest.Invoice(fmt.Sprintf("in_%d", i), "cus_1", "paid", 1000)))
	}
	for round, want := range []reconcile.Counts{{Stored: 3, MissingByType: map[string]int{"invoice.paid": 3}}, {AlreadyPresent: 3}} {
		resp := invoke(t, em, storeRequest(t, reconcile.StoreRequest{Op: reconcile.OpStore, Endpoint: "billing", Events: page}))
		var got reconcile.StoreResponse
		if resp.Status != 200 || json.Unmarshal(resp.Body, &got) != nil || got.Counts == nil {
			t.Fatalf("round %d: store answered %d %s", round, resp.Status, resp.Body)
		}
		if got.Counts.Stored != want.Stored || got.Counts.AlreadyPresent != want.AlreadyPresent || len(got.Counts.MissingByType) != len(want.MissingByType) {
			t.Fatalf("round %d: counts %+v, want %+v", round, *got.Counts, want)
		}
	}
	if n := db.Count(t, "webhook_inbox", "source = 'reconcile' AND processed_at IS NULL"); n != 3 {
		t.Fatalf("%d receipts with source reconcile, want 3", n)
	}

	resp := invoke(t, em, storeRequest(t, reconcile.StoreRequest{Op: reconcile.OpHighWater, Endpoint: "billing"}))
	if strings.TrimSpace(string(resp.Body)) != "{}" {
		t.Fatalf("no mark yet: answered %s", resp.Body)
	}
	mark := time.Now().Add(-time.Hour).UTC().Truncate(time.Second)
	invoke(t, em, storeRequest(t, reconcile.StoreRequest{Op: reconcile.OpAdvance, Endpoint: "billing", To: mark}))
	resp = invoke(t, em, storeRequest(t, reconcile.StoreRequest{Op: reconcile.OpHighWater, Endpoint: "billing"}))
	var hw reconcile.StoreResponse
	if json.Unmarshal(resp.Body, &hw) != nil || hw.HighWater == nil || !hw.HighWater.Equal(mark) {
		t.Fatalf("mark: answered %s, want %s", resp.Body, mark)
	}

	resp = invoke(t, em, storeRequest(t, reconcile.StoreRequest{Op: reconcile.OpStore, Endpoint: "connect", Events: page}))
	if !strings.Contains(string(resp.Body), `endpoint \"connect\" is not reconciled here`) {
		t.Fatalf("a foreign endpoint: answered %d %s", resp.Status, resp.Body)
	}
	if coldStarts(em) != 1 {
		t.Errorf("%d cold starts, want 1", coldStarts(em))
	}
}

// TestReconcilerHandsPagesToTheStoreFunction: the reconciler's binary
// (outside the VPC in AWS) lists the stand-in Events API and hands each page
// to the store function's binary through the real Lambda client
// (AWS_ENDPOINT_URL_LAMBDA points at the store function's emulator, which
// serves Lambda's Invoke path), which stores it.
func TestReconcilerHandsPagesToTheStoreFunction(t *testing.T) {
	t.Parallel()
	setup(t).binary(t, "reconcile")
	setup(t).binary(t, "reconcilestore")
	db := pgtest.DB(t)
	store := emulate(t, "reconcilestore", storeEnv(db), 20*time.Second)
	u, err := url.Parse(store.InvokeURL)
	if err != nil {
		t.Fatal(err)
	}

	api := fakeapi.New("rk_test_e2e")
	t.Cleanup(api.Close)
	now := time.Now()
	for i := range 150 {
		// Older than the settle window (an hour): listed at once.
		api.Add(stripetest.EventWith(fmt.Sprintf("evt_%03d", i), "invoice.paid", stripetest.Meta{Created: now.Add(-time.Hour - time.Duration(i+5)*time.Minute).Unix()},
			stripetest.Invoice(fmt.Sprintf("in_%03d", i), "cus_1", "paid", 1000)))
	}
	// The key comes from Secrets Manager (the stand-in), as in AWS; the
	// stack's placeholder is there first.
	keyARN := secretARNPrefix + "stripe-api-key-" + randomHex(4)
	sm := newSecretStore(t, map[string]string{keyARN: "PLACEHOLDER: store a Stripe restricted key"})
	rec := emulate(t, "reconcile", map[string]string{
		"STRIPE_API_KEY_SECRET_ARN":        keyARN,
		"AWS_ENDPOINT_URL_SECRETS_MANAGER": sm.URL,
		"STRIPE_API_BASE":                  api.URL,
		"STORE_FUNCTION":                   "function", // the emulator's function name in its invoke path
		"AWS_ENDPOINT_URL_LAMBDA":          "http://" + u.Host,
		"AWS_ACCESS_KEY_ID":                fakeAccessKey,
		"AWS_SECRET_ACCESS_KEY":            "e2e-fake-secret-access-key",
		"AWS_REGION":                       "us-east-1",
		"RECONCILE_ENDPOINT":               "billing",
		"STRIPE_MODE":                      "test",
		"RECONCILE_RATE":                   "100",
		"RECONCILE_LOOKBACK":               "4h",
		"RECONCILE_SLICE":                  "3d", // a probe of [-4h, -1h) has more; [-4h, -2h30m) holds 65; then 85 after them
		"DEADLINE_MARGIN":                  "3s",
		"METRICS_NAMESPACE":                "StripeInboxE2E",
		"METRICS_DIMENSIONS":               "Stage=e2e",
	}, 20*time.Second)

	// Until an operator stores a key, the function refuses to start and
	// says what to do.
	resp := invoke(t, rec, scheduledEvent("reconcile"))
	if resp.Status == 200 && !strings.Contains(string(resp.Body), "errorMessage") {
		t.Fatalf("with the placeholder the reconciler ran: %d %s", resp.Status, resp.Body)
	}
	waitLog(t, rec, "it is not a Stripe API key: store a restricted key with read access to events")
	if n := db.Count(t, "webhook_inbox", ""); n != 0 {
		t.Fatalf("%d receipts stored without a key", n)
	}

	sm.set(keyARN, "rk_test_e2e")
	resp = invoke(t, rec, scheduledEvent("reconcile"))
	var s reconcile.Summary
	if resp.Status != 200 || json.Unmarshal(resp.Body, &s) != nil {
		t.Fatalf("reconcile answered %d %s", resp.Status, resp.Body)
	}
	if s.Stored != 150 || s.Pages != 3 || !s.Complete {
		t.Fatalf("summary %s: want 150 stored in 3 pages (one probe narrowed, then oldest first), complete", resp.Body)
	}
	if n := db.Count(t, "webhook_inbox", "source = 'reconcile'"); n != 150 {
		t.Fatalf("%d receipts stored, want 150", n)
	}
	if n := db.Count(t, "reconcile_high_water", "endpoint = 'billing'"); n != 1 {
		t.Fatal("the mark was not set")
	}
	waitLog(t, rec, `"EventsFoundMissing":150`)

	// The next scheduled run lists from the mark: nothing new.
	resp = invoke(t, rec, scheduledEvent("reconcile"))
	if json.Unmarshal(resp.Body, &s) != nil || s.Stored != 0 {
		t.Fatalf("second run: %s", resp.Body)
	}

	// An operator rolls the key in the Stripe dashboard and stores the new
	// one: the warm function's next run gets a 401, fetches the key again
	// and goes on, without a cold start.
	api.SetKey("rk_test_e2e_rolled")
	sm.set(keyARN, "rk_test_e2e_rolled")
	resp = invoke(t, rec, scheduledEvent("reconcile"))
	if resp.Status != 200 || json.Unmarshal(resp.Body, &s) != nil || !s.Complete {
		t.Fatalf("run after the roll: %d %s", resp.Status, resp.Body)
	}
	waitLog(t, rec, "the key fetched again differs (rolled) and is used from now on")
}
