//go:build linux

package e2e_test

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stripe-inbox/inbox/e2e"
	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/stripetest"
)

// The ARNs the stack would put into SIGNING_SECRET_ARNS.
const (
	billingARN = "arn:aws:secretsmanager:us-east-1:000000000000:secret:billing-abc"
	connectARN = "arn:aws:secretsmanager:us-east-1:000000000000:secret:connect-def"
)

// fakeAccessKey is the function's (fake) AWS access key; the stand-in checks
// that the SDK signed with it.
const fakeAccessKey = "AKIAE2ETESTFAKEKEY00"

// webhookEnv is the environment the CDK stack gives the webhook, with the
// RDS Proxy replaced by the test's database and Secrets Manager by sm.
func webhookEnv(db *pgtest.Database, sm *secretStore, arns, ttl string) map[string]string {
	return map[string]string{
		"SIGNING_SECRET_ARNS":              arns,
		"SECRET_TTL":                       ttl,
		"DATABASE_URL":                     db.URL,
		"DB_MAX_CONNS":                     "2",
		"METRICS_NAMESPACE":                "StripeInboxE2E",
		"METRICS_DIMENSIONS":               "Stage=e2e",
		"AWS_REGION":                       "us-east-1",
		"AWS_DEFAULT_REGION":               "us-east-1",
		"AWS_ACCESS_KEY_ID":                fakeAccessKey,
		"AWS_SECRET_ACCESS_KEY":            "e2e-fake-secret-access-key",
		"AWS_SESSION_TOKEN":                "e2e-fake-session-token",
		"AWS_ENDPOINT_URL_SECRETS_MANAGER": sm.URL,
	}
}

// functionURLEvent is the payload-format-2.0 event a Lambda Function URL
// sends, written out as AWS documents it (not built from aws-lambda-go's
// types, so that a decoding mismatch in the handler shows).
func functionURLEvent(method, path string, headers map[string]string, body []byte, b64 bool) []byte {
	now := time.Now().UTC()
	h := map[string]string{
		"host":              "abcdefghij.lambda-url.us-east-1.on.aws",
		"user-agent":        "Stripe/1.0 (+https://stripe.com/docs/webhooks)",
		"content-type":      "application/json; charset=utf-8",
		"accept":            "*/*; q=0.5, application/xml",
		"cache-control":     "no-cache",
		"x-amzn-trace-id":   "Root=1-67891233-abcdef012345678912345678",
		"x-forwarded-for":   "3.18.12.63",
		"x-forwarded-port":  "443",
		"x-forwarded-proto": "https",
	}
	for k, v := range headers {
		h[strings.ToLower(k)] = v
	}
	encoded := string(body)
	if b64 {
		encoded = base64.StdEncoding.EncodeToString(body)
	}
	ev := map[string]any{
		"version":        "2.0",
		"routeKey":       "$default",
		"rawPath":        path,
		"rawQueryString": "",
		"headers":        h,
		"requestContext": map[string]any{
			"accountId":    "anonymous",
			"apiId":        "abcdefghij",
			"domainName":   "abcdefghij.lambda-url.us-east-1.on.aws",
			"domainPrefix": "abcdefghij",
			"http": map[string]any{
				"method":    method,
				"path":      path,
				"protocol":  "HTTP/1.1",
				"sourceIp":  "3.18.12.63",
				"userAgent": "Stripe/1.0 (+https://stripe.com/docs/webhooks)",
			},
			"requestId": randomHex(16),
			"routeKey":  "$default",
			"stage":     "$default",
			"time":      now.Format("02/Jan/2006:15:04:05 -0700"),
			"timeEpoch": now.UnixMilli(),
		},
		"body":            encoded,
		"isBase64Encoded": b64,
	}
	b, err := json.Marshal(ev)
	if err != nil {
		panic(err)
	}
	return b
}

// urlResponse is the Function URL response document the handler returns.
type urlResponse struct {
	StatusCode      int               `json:"statusCode"`
	Headers         map[string]string `json:"headers"`
	Body            string            `json:"body"`
	IsBase64Encoded bool              `json:"isBase64Encoded"`
}

// deliver invokes the webhook with a Function URL event and decodes the
// handler's answer; the invoke itself must succeed.
func deliver(t *testing.T, em *e2e.Emulator, method, path string, headers map[string]string, body []byte, b64 bool) urlResponse {
	t.Helper()
	resp := invoke(t, em, functionURLEvent(method, path, headers, body, b64))
	if resp.Status != http.StatusOK {
		t.Fatalf("invoke answered HTTP %d: %s", resp.Status, resp.Body)
	}
	var r urlResponse
	if err := json.Unmarshal(resp.Body, &r); err != nil {
		t.Fatalf("the webhook's answer is not a Function URL response: %v: %s", err, resp.Body)
	}
	if r.StatusCode == 0 {
		t.Fatalf("the webhook's answer has no statusCode: %s", resp.Body)
	}
	return r
}

// signed delivers body to path signed with secrets (now), as Stripe does.
func signed(t *testing.T, em *e2e.Emulator, path string, body []byte, b64 bool, secrets ...string) urlResponse {
	t.Helper()
	sig := stripetest.Sign(body, time.Now(), secrets...)
	return deliver(t, em, http.MethodPost, path, map[string]string{"Stripe-Signature": sig}, body, b64)
}

// wantAnswer checks a response's status and, when outcome is set, its
// {"received":true,"outcome":...} body.
func wantAnswer(t *testing.T, what string, r urlResponse, status int, outcome string) {
	t.Helper()
	if r.StatusCode != status {
		t.Errorf("%s: status %d (body %s), want %d", what, r.StatusCode, r.Body, status)
		return
	}
	if ct := r.Headers["content-type"]; ct != "application/json" {
		t.Errorf("%s: content-type %q, want application/json", what, ct)
	}
	var body struct {
		Received bool   `json:"received"`
		Outcome  string `json:"outcome"`
		Error    string `json:"error"`
	}
	if err := json.Unmarshal([]byte(r.Body), &body); err != nil {
		t.Errorf("%s: body %q is not JSON: %v", what, r.Body, err)
		return
	}
	if outcome != "" && (!body.Received || body.Outcome != outcome) {
		t.Errorf("%s: body %s, want outcome %q", what, r.Body, outcome)
	}
	if status >= 400 && body.Error == "" {
		t.Errorf("%s: body %s has no error message", what, r.Body)
	}
}

func invoicePaid(eventID, invoiceID string, amount int64) []byte {
	return stripetest.Event(eventID, "invoice.paid", stripetest.Invoice(invoiceID, "cus_e2e", "paid", amount))
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// TestWebhookDelivers: signed Function URL deliveries, plain and base64,
// to two endpoints, are stored once; redeliveries answer duplicate; and the
// signing secrets are fetched once at the cold start, not per request.
func TestWebhookDelivers(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	sm := newSecretStore(t, map[string]string{
		billingARN: "whsec_billing_e2e",
		connectARN: "whsec_connect_e2e",
	})
	// An hour's TTL: every request below is within it, so any fetch after
	// the cold start's would be a per-request fetch.
	em := emulate(t, "webhook", webhookEnv(db, sm, "billing="+billingARN+",connect="+connectARN, "1h"), 10*time.Second)

	plain := invoicePaid("evt_e2e_plain", "in_e2e_plain", 1500)
	wantAnswer(t, "plain body", signed(t, em, "/billing", plain, false, "whsec_billing_e2e"), 200, "stored")

	encoded := invoicePaid("evt_e2e_base64", "in_e2e_base64", 2500)
	wantAnswer(t, "base64 body", signed(t, em, "/billing", encoded, true, "whsec_billing_e2e"), 200, "stored")

	connect := invoicePaid("evt_e2e_connect", "in_e2e_connect", 3500)
	wantAnswer(t, "second endpoint", signed(t, em, "/connect", connect, false, "whsec_connect_e2e"), 200, "stored")

	// Stripe redelivers the same event, signed afresh, plain or base64.
	const redeliveries = 20
	for i := range redeliveries {
		wantAnswer(t, "redelivery", signed(t, em, "/billing", plain, i%2 == 1, "whsec_billing_e2e"), 200, "duplicate")
	}

	if n := db.Count(t, "webhook_inbox", "event_id = $1", "evt_e2e_plain"); n != 1 {
		t.Errorf("evt_e2e_plain: %d rows, want 1", n)
	}
	if n := db.Count(t, "webhook_inbox", ""); n != 3 {
		t.Errorf("%d receipts, want 3", n)
	}
	if n := db.Count(t, "webhook_inbox", "endpoint = 'connect' AND event_id = 'evt_e2e_connect'"); n != 1 {
		t.Errorf("evt_e2e_connect: %d rows on endpoint connect, want 1", n)
	}
	// The base64 body was decoded before it was verified and stored.
	if n := db.Count(t, "webhook_inbox", "event_id = 'evt_e2e_base64' AND payload = $1::jsonb AND processed_at IS NULL", string(encoded)); n != 1 {
		t.Errorf("evt_e2e_base64: stored payload differs from the delivered event")
	}

	for _, arn := range []string{billingARN, connectARN} {
		if n := sm.fetches(arn); n != 1 {
			t.Errorf("GetSecretValue(%s) called %d times over %d requests, want 1 (once per cold start)", arn, n, redeliveries+3)
		}
	}
	if n := coldStarts(em); n != 1 {
		t.Errorf("%d INIT phases, want 1: the function must serve every request from one cold start", n)
	}
	waitLog(t, em, `"msg":"webhook ready"`)
}

// TestWebhookRejects: what is not a verified delivery to a known endpoint is
// refused with a fixed answer, and nothing is stored.
func TestWebhookRejects(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	sm := newSecretStore(t, map[string]string{billingARN: "whsec_billing_e2e"})
	em := emulate(t, "webhook", webhookEnv(db, sm, "billing="+billingARN, "1h"), 10*time.Second)

	body := invoicePaid("evt_e2e_reject", "in_e2e_reject", 1000)
	sig := func(at time.Time, secret string) map[string]string {
		return map[string]string{"stripe-signature": stripetest.Sign(body, at, secret)}
	}
	cases := []struct {
		name    string
		method  string
		path    string
		headers map[string]string
		body    []byte
		b64     bool
		status  int
	}{
		{"wrong secret", "POST", "/billing", sig(time.Now(), "whsec_somebody_else"), body, false, 400},
		{"wrong secret, base64", "POST", "/billing", sig(time.Now(), "whsec_somebody_else"), body, true, 400},
		{"tampered body", "POST", "/billing", sig(time.Now(), "whsec_billing_e2e"), append([]byte(" "), body...), false, 400},
		{"timestamp too old", "POST", "/billing", sig(time.Now().Add(-time.Hour), "whsec_billing_e2e"), body, false, 400},
		{"no signature", "POST", "/billing", nil, body, false, 400},
		{"not base64", "POST", "/billing", sig(time.Now(), "whsec_billing_e2e"), []byte("%%%"), false, 400},
		{"unknown endpoint", "POST", "/shipping", sig(time.Now(), "whsec_billing_e2e"), body, false, 404},
		{"root path", "POST", "/", sig(time.Now(), "whsec_billing_e2e"), body, false, 404},
		{"GET", "GET", "/billing", sig(time.Now(), "whsec_billing_e2e"), body, false, 405},
	}
	for _, c := range cases {
		ev := functionURLEvent(c.method, c.path, c.headers, c.body, c.b64)
		if c.name == "not base64" {
			// A body flagged base64 that is not.
			ev = []byte(strings.Replace(string(ev), `"isBase64Encoded":false`, `"isBase64Encoded":true`, 1))
		}
		resp := invoke(t, em, ev)
		if resp.Status != http.StatusOK {
			t.Errorf("%s: invoke answered HTTP %d: %s", c.name, resp.Status, resp.Body)
			continue
		}
		var r urlResponse
		if err := json.Unmarshal(resp.Body, &r); err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		wantAnswer(t, c.name, r, c.status, "")
		if strings.Contains(r.Body, "whsec_") || strings.Contains(r.Body, "signature for this endpoint") {
			t.Errorf("%s: answer %s leaks internal detail", c.name, r.Body)
		}
	}
	if n := db.Count(t, "webhook_inbox", ""); n != 0 {
		t.Errorf("%d receipts stored from rejected requests, want 0", n)
	}
	// The rejections were logged with their reason.
	waitLog(t, em, `"reason":"bad_signature"`)
	waitLog(t, em, `"reason":"unknown_endpoint"`)
}

// TestWebhookSecretRoll: rolling the secret in Secrets Manager (new and old
// together, then only the new) is picked up by the running function within
// the TTL, without a restart.
func TestWebhookSecretRoll(t *testing.T) {
	t.Parallel()
	const ttl = 10 * time.Second // the shortest SECRET_TTL the config allows
	db := pgtest.DB(t)
	sm := newSecretStore(t, map[string]string{billingARN: "whsec_old"})
	em := emulate(t, "webhook", webhookEnv(db, sm, "billing="+billingARN, ttl.String()), 10*time.Second)
	start := time.Now()

	wantAnswer(t, "before the roll", signed(t, em, "/billing", invoicePaid("evt_roll_1", "in_roll_1", 100), false, "whsec_old"), 200, "stored")

	// pollUntil delivers body signed with secret until the answer has
	// status want, for at most 3 TTLs; every other answer must be 400
	// (a bad signature), never a 5xx.
	pollUntil := func(what string, body []byte, secret string, want int) {
		t.Helper()
		deadline := time.Now().Add(3 * ttl)
		for attempt := 1; ; attempt++ {
			r := signed(t, em, "/billing", body, false, secret)
			if r.StatusCode == want {
				t.Logf("%s: answered %d after %d attempts, %s into the roll", what, want, attempt, time.Since(start).Round(time.Millisecond))
				return
			}
			if r.StatusCode != 400 && r.StatusCode != 200 {
				t.Fatalf("%s: attempt %d answered %d (%s), want 200 or 400", what, attempt, r.StatusCode, r.Body)
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: still %d after %d attempts over %s (SECRET_TTL %s)", what, r.StatusCode, attempt, 3*ttl, ttl)
			}
			time.Sleep(250 * time.Millisecond)
		}
	}

	// Step 1 of a roll: the secret holds the new value and the old one.
	sm.set(billingARN, "whsec_new,whsec_old")
	pollUntil("signed with the new secret", invoicePaid("evt_roll_2", "in_roll_2", 200), "whsec_new", 200)
	wantAnswer(t, "old secret during the roll", signed(t, em, "/billing", invoicePaid("evt_roll_3", "in_roll_3", 300), false, "whsec_old"), 200, "stored")

	// Step 2: the old value is removed.
	sm.set(billingARN, "whsec_new")
	// Until the cached value expires the old secret is still accepted (the
	// first such delivery is stored, the rest are duplicates).
	pollUntil("signed with the retired secret", invoicePaid("evt_roll_old", "in_roll_old", 400), "whsec_old", 400)
	wantAnswer(t, "new secret after the roll", signed(t, em, "/billing", invoicePaid("evt_roll_4", "in_roll_4", 400), false, "whsec_new"), 200, "stored")

	elapsed := time.Since(start)
	for _, id := range []string{"evt_roll_1", "evt_roll_2", "evt_roll_3", "evt_roll_4"} {
		if n := db.Count(t, "webhook_inbox", "event_id = $1", id); n != 1 {
			t.Errorf("%s: %d rows, want 1", id, n)
		}
	}
	if n := coldStarts(em); n != 1 {
		t.Errorf("%d INIT phases, want 1: the roll must be picked up without a restart", n)
	}
	// One fetch at the cold start, then at most one per TTL (plus one
	// forced by a mismatch), however many requests were polled.
	fetches := sm.fetches(billingARN)
	if most := 2 + int(elapsed/ttl); fetches < 3 || fetches > most {
		t.Errorf("GetSecretValue called %d times in %s, want 3 to %d", fetches, elapsed.Round(time.Millisecond), most)
	}
	t.Logf("roll picked up in %s with %d GetSecretValue calls", elapsed.Round(time.Millisecond), fetches)
}

// TestInitFails: a function whose configuration is missing or malformed
// fails its init with a message naming the problem, in its log, and the
// invoke fails.
func TestInitFails(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		function string
		secret   *string // the stand-in's value for billingARN; nil: unknown
		env      func(map[string]string)
		want     []string // in the log
	}{
		{
			name: "webhook without signing secrets", function: "webhook", secret: ptr("whsec_ok"),
			env:  func(e map[string]string) { delete(e, "SIGNING_SECRET_ARNS") },
			want: []string{"webhook cannot start", "no signing secret: set STRIPE_WEBHOOK_SECRET=whsec_... (local) or SIGNING_SECRET_ARNS="},
		},
		{
			name: "webhook with a secret value instead of an ARN", function: "webhook", secret: ptr("whsec_ok"),
			env:  func(e map[string]string) { e["SIGNING_SECRET_ARNS"] = "billing=whsec_ok" },
			want: []string{"webhook cannot start", `is not a Secrets Manager ARN`},
		},
		{
			name: "webhook with an empty secret", function: "webhook", secret: ptr(""),
			want: []string{"webhook cannot start", `signing secret of endpoint "billing": it is empty`},
		},
		{
			name: "webhook with a secret that is not whsec_", function: "webhook", secret: ptr("sk_live_wrong_thing"),
			want: []string{"webhook cannot start", `signing secret of endpoint "billing": it holds a value that is not a Stripe signing secret`},
		},
		{
			name: "webhook with a secret that does not exist", function: "webhook", secret: nil,
			want: []string{"webhook cannot start", `fetching the signing secret of endpoint "billing"`, "ResourceNotFoundException"},
		},
		{
			name: "worker without a database", function: "worker",
			env:  func(e map[string]string) { delete(e, "DATABASE_URL") },
			want: []string{"worker cannot start", "set DATABASE_URL (local) or DB_PROXY_HOST"},
		},
		{
			name: "worker without a Stripe mode", function: "worker",
			env:  func(e map[string]string) { delete(e, "STRIPE_MODE") },
			want: []string{"worker cannot start", `STRIPE_MODE is required: set it to "live" on the stage that books real money (prod) or "test"`},
		},
		{
			name: "worker with a margin longer than its statements allow", function: "worker",
			env:  func(e map[string]string) { e["DEADLINE_MARGIN"] = "1s"; e["STATEMENT_TIMEOUT"] = "5s" },
			want: []string{"worker cannot start", "DEADLINE_MARGIN=1s must be longer than STATEMENT_TIMEOUT=5s"},
		},
		{
			name: "purge with a retention inside Stripe's retry window", function: "purge",
			env:  func(e map[string]string) { e["RETENTION_DAYS"] = "2" },
			want: []string{"purge cannot start", "RETENTION_DAYS=2: must be at least 4 days"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			setup(t).binary(t, c.function) // skip early when the function is not there
			db := pgtest.DB(t)
			var env map[string]string
			switch c.function {
			case "webhook":
				sm := newSecretStore(t, nil)
				if c.secret != nil {
					sm.set(billingARN, *c.secret)
				}
				env = webhookEnv(db, sm, "billing="+billingARN, "1h")
			case "worker":
				env = workerEnv(db)
			case "purge":
				env = purgeEnv(db)
			}
			if c.env != nil {
				c.env(env)
			}
			em := emulate(t, c.function, env, 10*time.Second)
			payload := scheduledEvent(c.function)
			if c.function == "webhook" {
				body := invoicePaid("evt_init_fail", "in_init_fail", 100)
				payload = functionURLEvent("POST", "/billing", map[string]string{"stripe-signature": stripetest.Sign(body, time.Now(), "whsec_ok")}, body, false)
			}
			resp := invoke(t, em, payload)
			if resp.Status != http.StatusBadGateway {
				t.Errorf("invoke answered HTTP %d (%s), want 502: an init failure must fail the invoke", resp.Status, resp.Body)
			}
			for _, s := range c.want {
				waitLog(t, em, s)
			}
			waitLog(t, em, "INIT RTDONE(status: error)")
			waitLog(t, em, "exited: exit status 1")
			if n := db.Count(t, "webhook_inbox", ""); n != 0 {
				t.Errorf("%d receipts stored by a function that failed its init", n)
			}
			// An init failure is retried on the next invoke, as in AWS,
			// and fails the same way.
			if resp := invoke(t, em, payload); resp.Status != http.StatusBadGateway {
				t.Errorf("second invoke answered HTTP %d (%s), want 502", resp.Status, resp.Body)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }
