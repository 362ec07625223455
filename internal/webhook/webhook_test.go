package webhook_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambda"
	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/database"
	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/metrics"
	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/secrets"
	"github.com/stripe-inbox/inbox/internal/stripeevent"
	"github.com/stripe-inbox/inbox/internal/stripetest"
	"github.com/stripe-inbox/inbox/internal/webhook"
)

const (
	secretA = "whsec_test_secret_a"
	secretB = "whsec_test_secret_b"
)

type testBundle struct {
	db      *pgtest.Database
	handler *webhook.Handler
	logs    *bytes.Buffer
	metrics *bytes.Buffer
}

// setup builds a handler over a fresh database with endpoints billing (secret
// A) and connect (secret B).
func setup(t *testing.T) *testBundle {
	t.Helper()
	db := pgtest.DB(t)
	return setupWith(t, db, map[string]string{"billing": secretA, "connect": secretB})
}

func setupWith(t *testing.T, db *pgtest.Database, endpoints map[string]string) *testBundle {
	t.Helper()
	keyring, err := secrets.NewKeyring(context.Background(), endpoints, secrets.Literal, secrets.Options{})
	require.NoError(t, err)
	b := &testBundle{db: db, logs: &bytes.Buffer{}, metrics: &bytes.Buffer{}}
	logger := slog.New(slog.NewJSONHandler(&lockedWriter{w: b.logs}, nil))
	em := metrics.New(&lockedWriter{w: b.metrics}, "Test", map[string]string{"Service": "webhook"})
	pool, err := database.Open(context.Background(), database.Config{URL: db.URL, MaxConns: 2}, nil)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	b.handler, err = webhook.New(pool, keyring, webhook.Config{MaxBodyBytes: 64 << 10}, logger, em)
	require.NoError(t, err)
	return b
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// eventJSON is a Stripe-shaped event.
func eventJSON(id, typ string) []byte {
	return []byte(fmt.Sprintf(`{
  "id": %q,
  "object": "event",
  "api_version": "2025-03-31.basil",
  "created": 1764633600,
  "livemode": false,
  "type": %q,
  "data": {"object": {"id": "in_123", "object": "invoice", "customer": "cus_1", "amount_paid": 1000}}
}`, id, typ))
}

// sign signs body at now with the independent signer (Stripe's documented
// scheme, not the stripe-go code the handler verifies with).
func sign(body []byte, secret string) string {
	return stripetest.Sign(body, time.Now(), secret)
}

// request builds the Function URL event for a POST to /endpoint.
func request(endpoint string, body []byte, header string) events.LambdaFunctionURLRequest {
	headers := map[string]string{"content-type": "application/json"}
	if header != "" {
		headers["stripe-signature"] = header
	}
	return events.LambdaFunctionURLRequest{
		Version: "2.0",
		RawPath: "/" + endpoint,
		Headers: headers,
		Body:    string(body),
		RequestContext: events.LambdaFunctionURLRequestContext{
			RequestID: "req-1",
			HTTP:      events.LambdaFunctionURLRequestContextHTTPDescription{Method: "POST", Path: "/" + endpoint},
		},
	}
}

func signedRequest(endpoint, id, typ, secret string) events.LambdaFunctionURLRequest {
	body := eventJSON(id, typ)
	return request(endpoint, body, sign(body, secret))
}

func (b *testBundle) do(t *testing.T, req events.LambdaFunctionURLRequest) events.LambdaFunctionURLResponse {
	t.Helper()
	resp, err := b.handler.Handle(context.Background(), req)
	require.NoError(t, err, "the handler answers every request with a status, never an error")
	return resp
}

func outcomeOf(t *testing.T, resp events.LambdaFunctionURLResponse) string {
	t.Helper()
	require.Equal(t, http.StatusOK, resp.StatusCode, resp.Body)
	var body struct {
		Received bool   `json:"received"`
		Outcome  string `json:"outcome"`
	}
	require.NoError(t, json.Unmarshal([]byte(resp.Body), &body))
	require.True(t, body.Received)
	return body.Outcome
}

func TestSameEventTwice(t *testing.T) {
	t.Parallel()
	b := setup(t)
	req := signedRequest("billing", "evt_1", "invoice.paid", secretA)

	require.Equal(t, "stored", outcomeOf(t, b.do(t, req)))
	require.Equal(t, "duplicate", outcomeOf(t, b.do(t, req)))
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", ""))

	var processed *time.Time
	var attempts int
	var payload string
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		"SELECT processed_at, attempts, payload->>'type' FROM webhook_inbox WHERE event_id = 'evt_1'").Scan(&processed, &attempts, &payload))
	require.Nil(t, processed, "the webhook stores the receipt unprocessed; the worker applies it")
	require.Equal(t, 0, attempts)
	require.Equal(t, "invoice.paid", payload)
}

func TestSameEventFromEightConnectionsAtOnce(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	req := signedRequest("billing", "evt_race", "invoice.paid", secretA)

	// Each delivery gets a handler whose pool holds exactly one connection of
	// its own, as eight Lambda instances would.
	const n = 8
	handlers := make([]*webhook.Handler, n)
	for i := range handlers {
		pool := poolOfOne(t, db)
		keyring, err := secrets.NewKeyring(context.Background(), map[string]string{"billing": secretA}, secrets.Literal, secrets.Options{})
		require.NoError(t, err)
		handlers[i], err = webhook.New(pool, keyring, webhook.Config{}, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
		require.NoError(t, err)
	}
	start := make(chan struct{})
	outcomes := make([]string, n)
	var wg sync.WaitGroup
	for i := range handlers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			resp, err := handlers[i].Handle(context.Background(), req)
			if err == nil && resp.StatusCode == http.StatusOK {
				var body struct{ Outcome string }
				_ = json.Unmarshal([]byte(resp.Body), &body)
				outcomes[i] = body.Outcome
			} else {
				outcomes[i] = fmt.Sprintf("status %d: %v", resp.StatusCode, err)
			}
		}()
	}
	close(start)
	wg.Wait()

	count := map[string]int{}
	for _, o := range outcomes {
		count[o]++
	}
	require.Equal(t, map[string]int{"stored": 1, "duplicate": 7}, count)
	require.Equal(t, 1, db.Count(t, "webhook_inbox", ""))
}

func TestSecondDeliveryWaitsForFirstAndStoresItWhenFirstRollsBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	body := eventJSON("evt_wait", "invoice.paid")
	ev, err := stripeevent.Verify(body, sign(body, secretA), []string{secretA})
	require.NoError(t, err)

	// Delivery 1: its transaction has inserted the receipt and is still open.
	first := b.db.Connect(t)
	tx, err := first.Begin(ctx)
	require.NoError(t, err)
	outcome, err := inbox.Store(ctx, tx, "billing", ev)
	require.NoError(t, err)
	require.Equal(t, inbox.Stored, outcome)

	// Delivery 2 goes through the handler and must wait on the unique index.
	done := make(chan events.LambdaFunctionURLResponse, 1)
	go func() {
		resp, _ := b.handler.Handle(ctx, request("billing", body, sign(body, secretA)))
		done <- resp
	}()
	b.db.WaitForLockWaiter(t)
	select {
	case resp := <-done:
		t.Fatalf("second delivery answered while the first was open: %d %s", resp.StatusCode, resp.Body)
	default:
	}

	require.NoError(t, tx.Rollback(ctx))
	resp := <-done
	require.Equal(t, "stored", outcomeOf(t, resp), "after the first rolls back, the second stores the receipt")
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", ""))
}

func TestSecondDeliveryIsDuplicateWhenFirstCommits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	body := eventJSON("evt_wait_commit", "invoice.paid")
	ev, err := stripeevent.Verify(body, sign(body, secretA), []string{secretA})
	require.NoError(t, err)

	first := b.db.Connect(t)
	tx, err := first.Begin(ctx)
	require.NoError(t, err)
	_, err = inbox.Store(ctx, tx, "billing", ev)
	require.NoError(t, err)

	done := make(chan events.LambdaFunctionURLResponse, 1)
	go func() {
		resp, _ := b.handler.Handle(ctx, request("billing", body, sign(body, secretA)))
		done <- resp
	}()
	b.db.WaitForLockWaiter(t)
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, "duplicate", outcomeOf(t, <-done))
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", ""))
}

func TestSameEventOnTwoEndpointsIsStoredForEach(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.Equal(t, "stored", outcomeOf(t, b.do(t, signedRequest("billing", "evt_both", "invoice.paid", secretA))))
	require.Equal(t, "stored", outcomeOf(t, b.do(t, signedRequest("connect", "evt_both", "invoice.paid", secretB))))
	require.Equal(t, 2, b.db.Count(t, "webhook_inbox", "event_id = 'evt_both'"))
}

func TestBadInputIsRefusedAndStoresNothing(t *testing.T) {
	t.Parallel()
	valid := eventJSON("evt_bad", "invoice.paid")
	validHeader := sign(valid, secretA)
	var reserialized bytes.Buffer
	require.NoError(t, json.Compact(&reserialized, valid))
	old := stripetest.Sign(valid, time.Now().Add(-stripeevent.Tolerance-time.Minute), secretA)
	tampered := bytes.Replace(valid, []byte(`"amount_paid": 1000`), []byte(`"amount_paid": 9000`), 1)
	oversize := append(append([]byte(nil), valid[:len(valid)-1]...), []byte(`,"pad":"`+strings.Repeat("x", 70<<10)+`"}`)...)
	signedOf := func(body []byte) events.LambdaFunctionURLRequest {
		return request("billing", body, sign(body, secretA))
	}

	cases := []struct {
		name   string
		req    events.LambdaFunctionURLRequest
		status int
		reason string
	}{
		{"missing header", request("billing", valid, ""), 400, "not_signed"},
		{"garbage header", request("billing", valid, "nonsense"), 400, "bad_signature"},
		{"tampered body", request("billing", tampered, validHeader), 400, "bad_signature"},
		{"body re-serialized with other whitespace", request("billing", reserialized.Bytes(), validHeader), 400, "bad_signature"},
		{"timestamp outside tolerance", request("billing", valid, old), 400, "signature_too_old"},
		{"signature from another endpoint's secret", request("billing", valid, sign(valid, secretB)), 400, "bad_signature"},
		{"unknown endpoint", request("payouts", valid, validHeader), 404, "unknown_endpoint"},
		{"root path", request("", valid, validHeader), 404, "unknown_endpoint"},
		{"nested path", request("billing/x", valid, validHeader), 404, "unknown_endpoint"},
		{"wrong method", func() events.LambdaFunctionURLRequest {
			r := request("billing", valid, validHeader)
			r.RequestContext.HTTP.Method = "GET"
			return r
		}(), 405, "method_not_allowed"},
		{"oversize body", signedOf(oversize), 413, "body_too_large"},
		{"oversize base64 body", func() events.LambdaFunctionURLRequest {
			r := signedOf(oversize)
			r.Body, r.IsBase64Encoded = base64.StdEncoding.EncodeToString(oversize), true
			return r
		}(), 413, "body_too_large"},
		{"invalid base64", func() events.LambdaFunctionURLRequest {
			r := signedOf(valid)
			r.Body, r.IsBase64Encoded = "!!not base64!!", true
			return r
		}(), 400, "bad_encoding"},
		{"empty body", request("billing", nil, sign(nil, secretA)), 400, "empty_body"},
		{"non-JSON", signedOf([]byte("hello")), 400, "malformed_event"},
		{"JSON array", signedOf([]byte(`[{"id":"evt_1","type":"x"}]`)), 400, "malformed_event"},
		{"JSON without id", signedOf([]byte(`{"type":"invoice.paid","data":{}}`)), 400, "malformed_event"},
		{"JSON without type", signedOf([]byte(`{"id":"evt_x","data":{}}`)), 400, "malformed_event"},
		{"id of wrong type", signedOf([]byte(`{"id":12,"type":"invoice.paid"}`)), 400, "malformed_event"},
		{"id with a space", signedOf([]byte(`{"id":"evt x","type":"invoice.paid"}`)), 400, "malformed_event"},
		{"JSON with a syntax error", signedOf([]byte(`{"id":"evt_1","type":"invoice.paid",}`)), 400, "malformed_event"},
		{"JSON cut short", signedOf([]byte(`{"id":"evt_1","type":"invoice.paid","x":"\ud800`)), 400, "malformed_event"},
		{"bad escape", signedOf([]byte(`{"id":"evt_1","type":"invoice.paid","x":"\x00"}`)), 400, "malformed_event"},
		{"NUL id", signedOf([]byte(`{"id":"evt\u0000","type":"invoice.paid"}`)), 400, "malformed_event"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			resp := b.do(t, tc.req)
			require.Equal(t, tc.status, resp.StatusCode, resp.Body)
			require.True(t, json.Valid([]byte(resp.Body)), resp.Body)
			require.NotContains(t, resp.Body, "webhook had", "internal error text must not reach the caller")
			require.Equal(t, 0, b.db.Count(t, "webhook_inbox", ""), "a refused request stores nothing")
			require.Contains(t, b.logs.String(), `"reason":"`+tc.reason+`"`)
			// One line by reason (dashboard), one in total (alarm).
			emf := strings.Split(strings.TrimSpace(b.metrics.String()), "\n")
			require.Len(t, emf, 2)
			require.Contains(t, emf[0], `"Reason":"`+tc.reason+`"`)
			require.Contains(t, emf[1], `"Rejected":1`)
			require.NotContains(t, emf[1], `"Reason"`)
		})
	}
}

func TestBase64AndPlainBodies(t *testing.T) {
	t.Parallel()
	b := setup(t)
	body := eventJSON("evt_b64", "invoice.paid")
	req := request("billing", body, sign(body, secretA))
	req.Body, req.IsBase64Encoded = base64.StdEncoding.EncodeToString(body), true
	require.Equal(t, "stored", outcomeOf(t, b.do(t, req)))

	// The same event as a plain body is the same receipt.
	require.Equal(t, "duplicate", outcomeOf(t, b.do(t, request("billing", body, sign(body, secretA)))))
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", ""))
}

func TestTwoSecretsDuringRotationAreBothAccepted(t *testing.T) {
	t.Parallel()
	b := setupWith(t, pgtest.DB(t), map[string]string{"billing": secretA + "," + secretB})
	require.Equal(t, "stored", outcomeOf(t, b.do(t, signedRequest("billing", "evt_old", "invoice.paid", secretA))))
	require.Equal(t, "stored", outcomeOf(t, b.do(t, signedRequest("billing", "evt_new", "invoice.paid", secretB))))

	// Stripe signs with both secrets during a roll: one header, two v1 values.
	body := eventJSON("evt_both_sigs", "invoice.paid")
	header := stripetest.Sign(body, time.Now(), "whsec_unknown", secretB)
	require.Equal(t, "stored", outcomeOf(t, b.do(t, request("billing", body, header))))
	require.Equal(t, 3, b.db.Count(t, "webhook_inbox", ""))
}

func TestNewerAPIVersionIsAcceptedAndStored(t *testing.T) {
	t.Parallel()
	b := setup(t)
	body := []byte(`{"id":"evt_future","object":"event","api_version":"2031-01-01.zeta","livemode":true,"account":"acct_9",` +
		`"type":"invoice.paid","data":{"object":{"id":"in_9","object":"invoice","new_field":{"x":1}}}}`)
	require.Equal(t, "stored", outcomeOf(t, b.do(t, request("billing", body, sign(body, secretA)))))

	var apiVersion, account, objectID, eventType string
	var livemode bool
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		`SELECT api_version, livemode, account, object_id, event_type FROM webhook_inbox WHERE event_id = 'evt_future'`).
		Scan(&apiVersion, &livemode, &account, &objectID, &eventType))
	require.Equal(t, "2031-01-01.zeta", apiVersion)
	require.True(t, livemode)
	require.Equal(t, "acct_9", account)
	require.Equal(t, "in_9", objectID)
	require.Equal(t, "invoice.paid", eventType)
}

func TestEventWithoutOptionalFieldsStoresNulls(t *testing.T) {
	t.Parallel()
	b := setup(t)
	body := []byte(`{"id":"evt_min","type":"ping"}`)
	require.Equal(t, "stored", outcomeOf(t, b.do(t, request("billing", body, sign(body, secretA)))))
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "api_version IS NULL AND account IS NULL AND object_id IS NULL AND NOT livemode"))
}

func TestStoreFailureAnswers5xxAndRetrySucceeds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	// Make the commit fail the way a broken database would: the table is
	// locked beyond the store timeout.
	locker := b.db.Connect(t)
	tx, err := locker.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "LOCK TABLE webhook_inbox IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)

	keyring, err := secrets.NewKeyring(ctx, map[string]string{"billing": secretA}, secrets.Literal, secrets.Options{})
	require.NoError(t, err)
	logs := &bytes.Buffer{}
	h, err := webhook.New(b.db.Pool, keyring, webhook.Config{StoreTimeout: 200 * time.Millisecond}, slog.New(slog.NewJSONHandler(logs, nil)), nil)
	require.NoError(t, err)
	req := signedRequest("billing", "evt_retry", "invoice.paid", secretA)
	resp, err := h.Handle(ctx, req)
	require.NoError(t, err)
	require.Equal(t, http.StatusInternalServerError, resp.StatusCode)
	require.JSONEq(t, `{"error":"receipt not stored; retry"}`, resp.Body)
	require.Contains(t, logs.String(), `"outcome":"failed"`)
	require.NoError(t, tx.Rollback(ctx))

	require.Equal(t, 0, b.db.Count(t, "webhook_inbox", ""))
	require.Equal(t, "stored", outcomeOf(t, b.do(t, req)), "Stripe's retry stores it")
}

func TestLogsAndMetricsPerRequest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	req := signedRequest("billing", "evt_log", "invoice.paid", secretA)
	b.do(t, req)
	b.do(t, req)

	lines := strings.Split(strings.TrimSpace(b.logs.String()), "\n")
	require.Len(t, lines, 2)
	var first map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &first))
	require.Equal(t, "evt_log", first["event_id"])
	require.Equal(t, "invoice.paid", first["event_type"])
	require.Equal(t, "billing", first["endpoint"])
	require.Equal(t, "stored", first["outcome"])
	require.Contains(t, first, "duration_ms")

	emf := strings.Split(strings.TrimSpace(b.metrics.String()), "\n")
	require.Len(t, emf, 2)
	require.Contains(t, emf[0], `"Received":1`)
	require.Contains(t, emf[1], `"Duplicate":1`)
}

func TestHTTPAdapterServesTheFunctionURLShape(t *testing.T) {
	t.Parallel()
	b := setup(t)
	srv := httptest.NewServer(webhook.HTTPHandler(b.handler))
	t.Cleanup(srv.Close)

	body := eventJSON("evt_http", "invoice.paid")
	post := func(contentType string) *http.Response {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/billing", bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", contentType)
		req.Header.Set("Stripe-Signature", sign(body, secretA))
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	require.Equal(t, http.StatusOK, post("application/json; charset=utf-8").StatusCode)
	// A body the Function URL would base64-encode still verifies.
	resp := post("application/octet-stream")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	got, _ := io.ReadAll(resp.Body)
	require.JSONEq(t, `{"received":true,"outcome":"duplicate"}`, string(got))
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", ""))
}

// TestFunctionURLRequestAsAWSSendsIt feeds the handler a Function URL
// request exactly as the Lambda runtime receives it: the JSON of AWS's
// payload format 2.0 (testdata/function-url-request.json, shaped as in
// "Invoking Lambda function URLs", Request payload format, with the headers a
// Stripe delivery carries and the body base64-encoded), decoded by
// aws-lambda-go's own handler (lambda.NewHandler, what lambda.Start runs).
// Only the signature is set here, because it must be fresh. The receipt must
// be stored with the event's exact bytes and fields.
func TestFunctionURLRequestAsAWSSendsIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	raw, err := os.ReadFile("testdata/function-url-request.json")
	require.NoError(t, err)
	var fixture map[string]any
	require.NoError(t, json.Unmarshal(raw, &fixture))
	body, err := base64.StdEncoding.DecodeString(fixture["body"].(string))
	require.NoError(t, err)
	fixture["headers"].(map[string]any)["stripe-signature"] = stripetest.Sign(body, time.Now(), secretA)
	payload, err := json.Marshal(fixture)
	require.NoError(t, err)

	out, err := lambda.NewHandler(b.handler.Handle).Invoke(ctx, payload)
	require.NoError(t, err)
	var resp struct {
		StatusCode int               `json:"statusCode"`
		Headers    map[string]string `json:"headers"`
		Body       string            `json:"body"`
	}
	require.NoError(t, json.Unmarshal(out, &resp), "%s", out)
	require.Equal(t, http.StatusOK, resp.StatusCode, resp.Body)
	require.JSONEq(t, `{"received":true,"outcome":"stored"}`, resp.Body)

	var endpoint, eventType, objectID string
	var livemode, exact bool
	var attempts int
	var processed *time.Time
	require.NoError(t, b.db.Pool.QueryRow(ctx, `
SELECT endpoint, event_type, object_id, livemode, attempts, processed_at,
       payload = $1::jsonb AND payload_raw IS NULL
  FROM webhook_inbox WHERE provider = 'stripe' AND event_id = 'evt_1QfUrl0000000000000000'`, string(body)).
		Scan(&endpoint, &eventType, &objectID, &livemode, &attempts, &processed, &exact))
	require.Equal(t, "billing", endpoint, "the endpoint is the request's path")
	require.Equal(t, "invoice.paid", eventType)
	require.Equal(t, "in_1QfUrl0000000000", objectID)
	require.False(t, livemode)
	require.Equal(t, 0, attempts)
	require.Nil(t, processed, "the webhook only stores; the worker applies")
	require.True(t, exact, "the payload is the decoded body")
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", ""))

	// The same request again (Stripe's retry) is a duplicate.
	out, err = lambda.NewHandler(b.handler.Handle).Invoke(ctx, payload)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(out, &resp))
	require.JSONEq(t, `{"received":true,"outcome":"duplicate"}`, resp.Body)
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", ""))
}

// Each receipt records which of the endpoint's secrets verified it (by its
// fingerprint, never the value) and the signature's timestamp; a duplicate
// delivery counts itself on the stored receipt and changes nothing else.
func TestReceiptRecordsTheMatchingSecretAndCountsDuplicates(t *testing.T) {
	t.Parallel()
	b := setupWith(t, pgtest.DB(t), map[string]string{"billing": secretA + "," + secretB})
	body := eventJSON("evt_fp", "invoice.paid")
	at := time.Now().Add(-time.Minute).Truncate(time.Second)
	header := stripetest.Sign(body, at, secretB)
	req := request("billing", body, header)
	require.Equal(t, "stored", outcomeOf(t, b.do(t, req)))
	require.Equal(t, "duplicate", outcomeOf(t, b.do(t, req)))
	require.Equal(t, "duplicate", outcomeOf(t, b.do(t, signedRequest("billing", "evt_fp", "invoice.paid", secretA))))

	var fp string
	var signedAt time.Time
	var dups int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		"SELECT secret_fingerprint, signed_at, duplicates FROM webhook_inbox WHERE event_id = 'evt_fp'").Scan(&fp, &signedAt, &dups))
	require.Equal(t, stripeevent.Fingerprint(secretB), fp, "the first delivery's secret, which the duplicates do not change")
	require.True(t, at.Equal(signedAt), "signed_at %s, want %s", signedAt, at)
	require.Equal(t, 2, dups)
	require.Zero(t, b.db.Count(t, "webhook_inbox", "secret_fingerprint LIKE 'whsec%' OR payload::text LIKE '%"+secretB+"%'"), "no secret stored")
}

// TestDeliveryOfAListedEventReplacesItsCopy: the reconciler stored the event
// first (in the version the account had when it was created); the
// endpoint's delivery replaces that copy while the receipt is unprocessed
// and is answered "stored" (its copy is the one booked), logged as
// replaced and counted by ListedCopyReplaced; a second delivery is a
// duplicate.
func TestDeliveryOfAListedEventReplacesItsCopy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	body := eventJSON("evt_listed", "invoice.paid")
	var m map[string]any
	require.NoError(t, json.Unmarshal(body, &m))
	m["api_version"] = "2024-06-20"
	listedBody, err := json.Marshal(m)
	require.NoError(t, err)
	listed, err := stripeevent.Parse(listedBody)
	require.NoError(t, err)
	out, err := inbox.StoreFrom(ctx, b.db.Pool, inbox.SourceReconcile, "billing", listed)
	require.NoError(t, err)
	require.Equal(t, inbox.Stored, out)

	resp := b.do(t, request("billing", body, sign(body, secretA)))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "stored", outcomeOf(t, resp))
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "event_id = 'evt_listed' AND source = 'webhook' AND listed_first AND api_version <> '2024-06-20'"))
	require.Contains(t, b.logs.String(), `"outcome":"replaced"`)
	require.Contains(t, b.metrics.String(), `"ListedCopyReplaced":1`)

	require.Equal(t, "duplicate", outcomeOf(t, b.do(t, request("billing", body, sign(body, secretA)))))
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "event_id = 'evt_listed' AND duplicates = 1"))
}
