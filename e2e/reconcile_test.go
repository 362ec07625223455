//go:build linux

package e2e_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stripe-inbox/inbox/internal/invokeproof"
	"github.com/stripe-inbox/inbox/internal/invokeproof/ststest"
	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/reconcile"
	"github.com/stripe-inbox/inbox/internal/reconcile/fakeapi"
	"github.com/stripe-inbox/inbox/internal/stripetest"
)

// The reconciler's role, as the stand-in STS reports the reconciler
// function's credentials (fakeAccessKey, the environment every function
// here gets) and as the store function admits it (RECONCILER_ROLE_ARN).
const reconcileRole = "e2e-reconcile-role"

// reconcilerPrincipal is the reconciler function's identity in the STS
// stand-in: its environment's fake credentials.
var reconcilerPrincipal = callerPrincipal(reconcileRole, "inbox-reconcile", "AROAE2ERECONCILE:inbox-reconcile")

// storeEnv is the environment the CDK stack gives the reconciler's store
// function, with the test's database and the STS stand-in it verifies
// proofs with.
func storeEnv(db *pgtest.Database, sts *ststest.Server) map[string]string {
	return storeFunctionEnv(db, sts, "RECONCILER_ROLE_ARN", reconcileRole, map[string]string{"RECONCILE_ENDPOINTS": "billing"})
}

// provenStoreRequest is req as the reconciler sends it: in an envelope with its
// proof, signed with who's credentials for the STS stand-in.
func provenStoreRequest(t *testing.T, sts *ststest.Server, who ststest.Principal, req reconcile.StoreRequest, at time.Time) []byte {
	t.Helper()
	return provenRequest(t, sts, who, reconcile.StoreAudience, req, at)
}

// TestReconcileStoreFunction: the in-VPC store function's binary, invoked
// as the reconciler invokes it, stores a page of events as receipts (source
// reconcile), counts a second delivery of the page as already present, keeps
// the high-water mark, and refuses an endpoint it does not reconcile.
func TestReconcileStoreFunction(t *testing.T) {
	t.Parallel()
	setup(t).binary(t, "reconcilestore")
	db := pgtest.DB(t)
	sts := ststest.New(t, reconcilerPrincipal)
	em := emulate(t, "reconcilestore", storeEnv(db, sts), 20*time.Second)
	storeRequest := func(t *testing.T, req reconcile.StoreRequest) []byte {
		return provenStoreRequest(t, sts, reconcilerPrincipal, req, time.Now())
	}

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

// TestReconcileStoreFunctionRefusesUnprovenRequests: the store function's
// binary, invoked with a forged request (a developer's genuine credentials,
// an invoice.paid of their own), the reconciler's proof over another page,
// a request without a proof (the shape before this release), the
// reconciler's request signed ten minutes ago (a replay), and the
// reconciler's request now: only the last stores. Each refusal fails the
// invocation with its reason and is counted (InvokeProofRefused).
func TestReconcileStoreFunctionRefusesUnprovenRequests(t *testing.T) {
	t.Parallel()
	setup(t).binary(t, "reconcilestore")
	db := pgtest.DB(t)
	developer := ststest.RoleSession("Developer", "dev@example.com", "ASIAE2EDEVELOPER")
	sts := ststest.New(t, reconcilerPrincipal, developer)
	em := emulate(t, "reconcilestore", storeEnv(db, sts), 20*time.Second)

	page := func(id string) reconcile.StoreRequest {
		return reconcile.StoreRequest{Op: reconcile.OpStore, Endpoint: "billing", Events: []json.RawMessage{
			stripetest.Event(id, "invoice.paid", stripetest.Invoice("in_"+id, "cus_1", "paid", 990000)),
		}}
	}
	refused := func(what string, payload []byte, reason string) {
		t.Helper()
		resp := invoke(t, em, payload)
		if !strings.Contains(string(resp.Body), "refused: the request is not proven to come from the reconciler ("+reason+")") {
			t.Fatalf("%s: answered %d %s, want a refusal (%s)", what, resp.Status, resp.Body, reason)
		}
	}
	refused("a developer's request", provenStoreRequest(t, sts, developer, page("evt_forged"), time.Now()), "principal")

	var env invokeproof.Envelope
	if err := json.Unmarshal(provenStoreRequest(t, sts, reconcilerPrincipal, page("evt_real"), time.Now()), &env); err != nil {
		t.Fatal(err)
	}
	swapped, _ := json.Marshal(page("evt_swapped"))
	forged, _ := json.Marshal(invokeproof.Envelope{Payload: swapped, Proof: env.Proof})
	refused("the reconciler's proof over another page", forged, "forged")

	bare, _ := json.Marshal(page("evt_bare"))
	refused("a request without a proof", bare, "missing")

	refused("a replayed request", provenStoreRequest(t, sts, reconcilerPrincipal, page("evt_old"), time.Now().Add(-10*time.Minute)), "stale")

	if n := db.Count(t, "webhook_inbox", ""); n != 0 {
		t.Fatalf("%d receipts stored by refused requests", n)
	}

	valid, _ := json.Marshal(env)
	resp := invoke(t, em, valid)
	var got reconcile.StoreResponse
	if resp.Status != 200 || json.Unmarshal(resp.Body, &got) != nil || got.Counts == nil || got.Counts.Stored != 1 {
		t.Fatalf("the reconciler's request: answered %d %s", resp.Status, resp.Body)
	}
	if n := db.Count(t, "webhook_inbox", "event_id = 'evt_real' AND source = 'reconcile'"); n != 1 || db.Count(t, "webhook_inbox", "") != 1 {
		t.Fatalf("want exactly evt_real stored")
	}
	waitLog(t, em, `"InvokeProofRefused":1`)
	for _, reason := range []string{"principal", "forged", "missing", "stale"} {
		waitLog(t, em, `"Reason":"`+reason+`"`)
	}
	if got := strings.Count(em.Log(), `"InvokeProofRefused":1`); got != 8 { // total + by reason, four times
		t.Errorf("%d InvokeProofRefused lines, want 8", got)
	}
	if coldStarts(em) != 1 {
		t.Errorf("%d cold starts: a refusal must not crash the function", coldStarts(em))
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
	sts := ststest.New(t, reconcilerPrincipal)
	store := emulate(t, "reconcilestore", storeEnv(db, sts), 20*time.Second)

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
	rec := emulate(t, "reconcile", callerEnv(t, store, sts, map[string]string{
		"STRIPE_API_KEY_SECRET_ARN":        keyARN,
		"AWS_ENDPOINT_URL_SECRETS_MANAGER": sm.URL,
		"STRIPE_API_BASE":                  api.URL,
		"RECONCILE_ENDPOINT":               "billing",
		"STRIPE_MODE":                      "test",
		"RECONCILE_RATE":                   "100",
		"RECONCILE_LOOKBACK":               "4h",
		"RECONCILE_SLICE":                  "3d", // a probe of [-4h, -1h) has more; [-4h, -2h30m) holds 65; then 85 after them
	}), 20*time.Second)

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

	// A full secret key is refused in AWS: it asks for a restricted one.
	sm.set(keyARN, "sk_test_e2e")
	resp = invoke(t, rec, scheduledEvent("reconcile"))
	if resp.Status == 200 && !strings.Contains(string(resp.Body), "errorMessage") {
		t.Fatalf("with an sk_ key the reconciler ran: %d %s", resp.Status, resp.Body)
	}
	waitLog(t, rec, "a full Stripe secret key (sk_...) is not accepted here: create a restricted key (rk_...) with only Events: Read")
	if n := db.Count(t, "webhook_inbox", ""); n != 0 {
		t.Fatalf("%d receipts stored with a full secret key", n)
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
