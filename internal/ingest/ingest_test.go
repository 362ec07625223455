package ingest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/database"
	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/ingest"
	"github.com/stripe-inbox/inbox/internal/metrics"
	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/secrets"
	"github.com/stripe-inbox/inbox/internal/stripeevent"
	"github.com/stripe-inbox/inbox/internal/stripetest"
	"github.com/stripe-inbox/inbox/internal/webhook"
	"github.com/stripe-inbox/inbox/internal/worker"
)

const secret = "whsec_ingest_test"

type testBundle struct {
	db      *pgtest.Database
	ingest  *ingest.Handler
	hook    *webhook.Handler
	metrics *bytes.Buffer
}

// pool opens a pool of its own: the webhook and the ingest function are
// separate processes with separate connections.
func pool(t *testing.T, db *pgtest.Database, conns int32) *pgxpool.Pool {
	t.Helper()
	p, err := database.Open(context.Background(), database.Config{URL: db.URL, MaxConns: conns}, nil)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	db := pgtest.DB(t)
	b := &testBundle{db: db, metrics: &bytes.Buffer{}}
	logger := slog.New(slog.NewJSONHandler(io.Discard, nil))
	var err error
	b.ingest, err = ingest.New(pool(t, db, 4), ingest.Sources{Exact: map[string]string{stripetest.EventBridgeSource: "billing"}},
		logger, metrics.New(b.metrics, "Test", nil))
	require.NoError(t, err)
	keyring, err := secrets.NewKeyring(context.Background(), map[string]string{"billing": secret}, secrets.Literal, secrets.Options{})
	require.NoError(t, err)
	b.hook, err = webhook.New(pool(t, db, 4), keyring, webhook.Config{}, logger, nil)
	require.NoError(t, err)
	return b
}

func paid(id, invoice string) []byte {
	return stripetest.Event(id, "invoice.paid", stripetest.Invoice(invoice, "cus_1", "paid", 2000))
}

func (b *testBundle) deliver(t *testing.T, payload []byte) string {
	t.Helper()
	resp, err := b.hook.Handle(context.Background(), events.LambdaFunctionURLRequest{
		RawPath: "/billing",
		Headers: map[string]string{"stripe-signature": stripetest.Sign(payload, time.Now(), secret)},
		Body:    string(payload),
		RequestContext: events.LambdaFunctionURLRequestContext{
			HTTP: events.LambdaFunctionURLRequestContextHTTPDescription{Method: "POST"},
		},
	})
	require.NoError(t, err)
	require.Equal(t, 200, resp.StatusCode, resp.Body)
	return resp.Body
}

func (b *testBundle) runWorker(t *testing.T) worker.Summary {
	t.Helper()
	p, err := database.Open(context.Background(), database.Config{URL: b.db.URL, MaxConns: 3, PreparedStatements: true}, nil)
	require.NoError(t, err)
	defer p.Close()
	cfg := worker.Config{Mode: worker.ModeTest, Concurrency: 1, MaxAttempts: 3, StatementTimeout: time.Second, DeadlineMargin: 2 * time.Second, Lease: time.Minute}.WithDefaults()
	require.NoError(t, cfg.Validate())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w, err := worker.New(p, handlers.Default(), cfg, slog.New(slog.NewJSONHandler(io.Discard, nil)), nil)
	require.NoError(t, err)
	s, err := w.Run(ctx)
	require.NoError(t, err)
	require.Zero(t, s.Failed)
	return s
}

// requireOneBooking: one receipt of evt, one payment of invoice.
func (b *testBundle) requireOneBooking(t *testing.T, evt, invoice string) {
	t.Helper()
	b.runWorker(t)
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "event_id = $1 AND processed_at IS NOT NULL", evt))
	require.Equal(t, 1, b.db.Count(t, "ledger_entries", "invoice_id = $1", invoice))
}

func TestWebhookFirstThenEventBridge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	payload := paid("evt_wf", "in_wf")
	require.Contains(t, b.deliver(t, payload), `"stored"`)
	res, err := b.ingest.Ingest(context.Background(), stripetest.EventBridge("eb-1", stripetest.EventBridgeSource, payload))
	require.NoError(t, err)
	require.Equal(t, ingest.Duplicate, res.Outcome)
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "event_id = 'evt_wf' AND source = 'webhook'"))
	b.requireOneBooking(t, "evt_wf", "in_wf")
}

func TestEventBridgeFirstThenWebhook(t *testing.T) {
	t.Parallel()
	b := setup(t)
	payload := paid("evt_ef", "in_ef")
	res, err := b.ingest.Ingest(context.Background(), stripetest.EventBridge("eb-1", stripetest.EventBridgeSource, payload))
	require.NoError(t, err)
	require.Equal(t, ingest.Result{Outcome: ingest.Stored, Source: stripetest.EventBridgeSource, Endpoint: "billing", EventID: "evt_ef", EventType: "invoice.paid"}, res)
	require.Contains(t, b.deliver(t, payload), `"duplicate"`)
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "event_id = 'evt_ef' AND source = 'eventbridge' AND NOT listed_first"))
	b.requireOneBooking(t, "evt_ef", "in_ef")
	require.Contains(t, b.metrics.String(), `"IngestReceived"`)
}

// TestBothAtOnce delivers each event by the webhook and by EventBridge at
// the same moment, on separate connections: exactly one of the two is
// stored, the other is a duplicate, and the worker books once.
func TestBothAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 20
	var wg sync.WaitGroup
	outcomes := make([][2]string, n)
	for i := range n {
		payload := paid(fmt.Sprintf("evt_both_%d", i), fmt.Sprintf("in_both_%d", i))
		start := make(chan struct{})
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-start
			body := b.deliver(t, payload)
			outcomes[i][0] = body
		}()
		go func() {
			defer wg.Done()
			<-start
			res, err := b.ingest.Ingest(context.Background(), stripetest.EventBridge(fmt.Sprintf("eb-%d", i), stripetest.EventBridgeSource, payload))
			if err != nil {
				outcomes[i][1] = err.Error()
				return
			}
			outcomes[i][1] = string(res.Outcome)
		}()
		close(start)
	}
	wg.Wait()
	for i, o := range outcomes {
		hookStored := bytes.Contains([]byte(o[0]), []byte(`"stored"`))
		hookDup := bytes.Contains([]byte(o[0]), []byte(`"duplicate"`))
		require.True(t, hookStored || hookDup, "event %d: webhook answered %s", i, o[0])
		require.Contains(t, []string{"stored", "duplicate"}, o[1], "event %d", i)
		require.NotEqual(t, hookStored, o[1] == "stored", "event %d: exactly one path stores it (webhook %s, eventbridge %s)", i, o[0], o[1])
	}
	require.Equal(t, n, b.db.Count(t, "webhook_inbox", "event_id LIKE 'evt_both_%'"))
	s := b.runWorker(t)
	require.Equal(t, n, s.Processed)
	require.Equal(t, n, b.db.Count(t, "ledger_entries", "invoice_id LIKE 'in_both_%'"))
}

// TestRedeliveryInANewEnvelope: EventBridge retries with the same event in
// an envelope of another id (or the queue redelivers the message): a
// duplicate.
func TestRedeliveryInANewEnvelope(t *testing.T) {
	t.Parallel()
	b := setup(t)
	payload := paid("evt_re", "in_re")
	for i, want := range []ingest.Outcome{ingest.Stored, ingest.Duplicate, ingest.Duplicate} {
		res, err := b.ingest.Ingest(context.Background(), stripetest.EventBridge(fmt.Sprintf("eb-%d", i), stripetest.EventBridgeSource, payload))
		require.NoError(t, err)
		require.Equal(t, want, res.Outcome, "delivery %d", i)
	}
	b.requireOneBooking(t, "evt_re", "in_re")
	require.Contains(t, b.metrics.String(), `"IngestDuplicate"`)
}

// TestEventBridgeReplacesAListedCopy: the reconciler listed the event
// first; the EventBridge delivery is the endpoint's own, so it replaces the
// listed copy, as the webhook's does.
func TestEventBridgeReplacesAListedCopy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	payload := paid("evt_listed", "in_listed")
	ev, err := stripeevent.Parse(payload)
	require.NoError(t, err)
	out, err := inbox.StoreFrom(context.Background(), b.db.Pool, inbox.SourceReconcile, "billing", ev)
	require.NoError(t, err)
	require.Equal(t, inbox.Stored, out)
	res, err := b.ingest.Ingest(context.Background(), stripetest.EventBridge("eb-1", stripetest.EventBridgeSource, payload))
	require.NoError(t, err)
	require.Equal(t, ingest.Stored, res.Outcome)
	require.True(t, res.Replaced)
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "event_id = 'evt_listed' AND source = 'eventbridge' AND listed_first"))
	require.Contains(t, b.deliver(t, payload), `"duplicate"`, "a webhook delivery does not replace the EventBridge copy")
	b.requireOneBooking(t, "evt_listed", "in_listed")
}

// TestRefusals: what cannot be stored is refused for good, with its reason,
// and leaves nothing behind.
func TestRefusals(t *testing.T) {
	t.Parallel()
	b := setup(t)
	good := paid("evt_ok", "in_ok")
	for _, tc := range []struct {
		name, reason string
		body         []byte
	}{
		{"unknown source", ingest.ReasonUnknownSource, stripetest.EventBridge("eb", "aws.partner/stripe.com/ed_someone_else", good)},
		{"not a partner source", ingest.ReasonUnknownSource, stripetest.EventBridge("eb", "aws.events", good)},
		{"not json", ingest.ReasonNotEnvelope, []byte("hello")},
		{"no detail", ingest.ReasonNotEnvelope, []byte(`{"source":"` + stripetest.EventBridgeSource + `"}`)},
		{"the detail is not an event", ingest.ReasonNotStripe, stripetest.EventBridge("eb", stripetest.EventBridgeSource, []byte(`{"id":"in_1","object":"invoice"}`))},
		{"the detail is an array", ingest.ReasonNotStripe, stripetest.EventBridge("eb", stripetest.EventBridgeSource, []byte(`[1]`))},
		{"an event without evt_ id", ingest.ReasonNotStripe, stripetest.EventBridge("eb", stripetest.EventBridgeSource, paid("ch_1", "in_x"))},
		{"an event without a type", ingest.ReasonNotStripe, stripetest.EventBridge("eb", stripetest.EventBridgeSource, []byte(`{"id":"evt_nt","object":"event"}`))},
		{"too large", ingest.ReasonTooLarge, bytes.Repeat([]byte(" "), ingest.MaxEnvelopeBytes+1)},
	} {
		_, err := b.ingest.Ingest(context.Background(), tc.body)
		require.ErrorIs(t, err, ingest.ErrRefused, tc.name)
		require.Equal(t, tc.reason, ingest.ReasonOf(err), tc.name)
	}
	require.Equal(t, 0, b.db.Count(t, "webhook_inbox", "true"))
	require.Contains(t, b.metrics.String(), `"IngestRefused"`)
	require.Contains(t, b.metrics.String(), `"Reason":"unknown_source"`)
}

// TestTransientFailure: a database that cannot be reached is not a refusal.
func TestTransientFailure(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := pool(t, b.db, 1)
	h, err := ingest.New(p, ingest.Sources{Default: "billing"}, slog.New(slog.NewJSONHandler(io.Discard, nil)), nil)
	require.NoError(t, err)
	p.Close()
	_, err = h.Ingest(context.Background(), stripetest.EventBridge("eb", stripetest.EventBridgeSource, paid("evt_tr", "in_tr")))
	require.Error(t, err)
	require.NotErrorIs(t, err, ingest.ErrRefused)
}

// TestThinEvent: a thin notification is stored with its related object
// (object_id), whichever path brings it.
func TestThinEvent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	thin := stripetest.ThinEvent("evt_test_65thin", "v1.billing.meter.error_report_triggered", "mtr_test_1", "billing.meter")
	res, err := b.ingest.Ingest(context.Background(), stripetest.EventBridge("eb", stripetest.EventBridgeSource, thin))
	require.NoError(t, err)
	require.Equal(t, ingest.Stored, res.Outcome)
	require.Contains(t, b.deliver(t, thin), `"duplicate"`)
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "event_id = 'evt_test_65thin' AND object_id = 'mtr_test_1' AND source = 'eventbridge'"))
}

func TestDefaultSource(t *testing.T) {
	t.Parallel()
	s := ingest.Sources{Default: "billing", Exact: map[string]string{"aws.partner/stripe.com/ed_connect": "connect"}}
	for src, want := range map[string]string{
		"aws.partner/stripe.com/ed_connect": "connect",
		"aws.partner/stripe.com/ed_other":   "billing",
		"aws.partner/stripe.com/":           "",
		"aws.partner/other.com/ed_x":        "",
	} {
		ep, ok := s.Endpoint(src)
		require.Equal(t, want != "", ok, src)
		require.Equal(t, want, ep, src)
	}
	_, err := ingest.New(&pgxpool.Pool{}, ingest.Sources{Exact: map[string]string{"aws.events": "billing"}}, slog.Default(), nil)
	require.ErrorContains(t, err, `"aws.events" is not a Stripe partner event source`)
	_, err = ingest.New(&pgxpool.Pool{}, ingest.Sources{}, slog.Default(), nil)
	require.ErrorContains(t, err, "EVENTBRIDGE_SOURCES")
}

// TestThinEventsProcessed: the worker raises an anomaly naming the related
// object for v2.core.health.event_generation_failure.resolved (by
// EventBridge or by the webhook), and marks other thin types ignored with
// their related object.
func TestThinEventsProcessed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	failure := stripetest.ThinEvent("evt_test_gen1", handlers.EventGenerationFailureResolved, "in_lost_1", "invoice")
	_, err := b.ingest.Ingest(context.Background(), stripetest.EventBridge("eb", stripetest.EventBridgeSource, failure))
	require.NoError(t, err)
	// By the webhook, with no related object: the anomaly names the event.
	var m map[string]any
	require.NoError(t, json.Unmarshal(stripetest.ThinEvent("evt_test_gen2", handlers.EventGenerationFailureResolved, "x", "invoice"), &m))
	delete(m, "related_object")
	bare, err := json.Marshal(m)
	require.NoError(t, err)
	require.Contains(t, b.deliver(t, bare), `"stored"`)
	other := stripetest.ThinEvent("evt_test_meter", "v1.billing.meter.error_report_triggered", "mtr_test_1", "billing.meter")
	_, err = b.ingest.Ingest(context.Background(), stripetest.EventBridge("eb2", stripetest.EventBridgeSource, other))
	require.NoError(t, err)

	s := b.runWorker(t)
	require.Equal(t, 1, s.Ignored)
	require.Equal(t, 1, b.db.Count(t, "anomalies", "kind = 'event_generation_failure' AND subject_id = 'in_lost_1' AND event_id = 'evt_test_gen1' AND detail->'related_object'->>'type' = 'invoice'"))
	require.Equal(t, 1, b.db.Count(t, "anomalies", "kind = 'event_generation_failure' AND subject_id = 'evt_test_gen2' AND detail->>'fetch' LIKE 'GET /v2/core/events/evt_test_gen2%'"))
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "event_id = 'evt_test_meter' AND outcome = 'ignored' AND object_id = 'mtr_test_1'"))
	require.Equal(t, 2, b.db.Count(t, "webhook_inbox", "event_type = $1 AND outcome = 'applied'", handlers.EventGenerationFailureResolved))
}
