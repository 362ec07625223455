package retention_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/database"
	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/metrics"
	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/retention"
	"github.com/stripe-inbox/inbox/internal/stripeevent"
	"github.com/stripe-inbox/inbox/internal/stripetest"
	"github.com/stripe-inbox/inbox/internal/worker"
)

type testBundle struct {
	db      *pgtest.Database
	pool    *pgxpool.Pool
	metrics *bytes.Buffer
	logs    *bytes.Buffer
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	db := pgtest.DB(t)
	pool, err := database.Open(context.Background(), database.Config{URL: db.URL, MaxConns: 10}, nil)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return &testBundle{db: db, pool: pool, metrics: &bytes.Buffer{}, logs: &bytes.Buffer{}}
}

// newPurger builds a purger on db (the pool when nil) with cfg over the
// defaults, at now (nil: the database's now()).
func (b *testBundle) newPurger(t *testing.T, db retention.DB, cfg retention.Config, now *time.Time) *retention.Purger {
	t.Helper()
	cfg = cfg.WithDefaults()
	require.NoError(t, cfg.Validate())
	if db == nil {
		db = b.pool
	}
	em := metrics.New(b.metrics, "Test", map[string]string{"Service": "purge"})
	p, err := retention.New(db, cfg, slog.New(slog.NewJSONHandler(b.logs, nil)), em)
	require.NoError(t, err)
	p.Now = func() *time.Time { return now }
	return p
}

func (b *testBundle) purge(t *testing.T, p *retention.Purger) retention.Summary {
	t.Helper()
	s, err := p.Run(context.Background())
	require.NoError(t, err)
	return s
}

func (b *testBundle) newWorker(t *testing.T) *worker.Worker {
	t.Helper()
	cfg := worker.Config{Mode: worker.ModeTest, Concurrency: 2, StatementTimeout: time.Second, DeadlineMargin: 6 * time.Second, Lease: time.Minute}.WithDefaults()
	require.NoError(t, cfg.Validate())
	w, err := worker.New(b.pool, handlers.Default(), cfg, slog.New(slog.NewJSONHandler(io.Discard, nil)), nil)
	require.NoError(t, err)
	return w
}

// receive stores an event as the webhook would.
func (b *testBundle) receive(t *testing.T, payload []byte) inbox.StoreOutcome {
	t.Helper()
	var head struct{ ID, Type string }
	require.NoError(t, json.Unmarshal(payload, &head))
	out, err := inbox.Store(context.Background(), b.pool, "billing", stripeevent.Event{ID: head.ID, Type: head.Type, Payload: payload})
	require.NoError(t, err)
	return out
}

// receipts inserts n receipts named prefix1..prefixN, received at received
// and processed at processed (nil: unprocessed), with attempts used. Their
// payload carries a customer e-mail address (personal data).
func (b *testBundle) receipts(t *testing.T, prefix string, n int, received time.Time, processed *time.Time, attempts int) {
	t.Helper()
	_, err := b.pool.Exec(context.Background(), `
INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, payload,
                           received_at, available_at, attempts, processed_at, outcome)
SELECT 'stripe', 'billing', $1 || g, 'invoice.paid', false,
       jsonb_build_object('id', $1 || g, 'customer_email', 'jenny@example.com'),
       $2, $2, $4, $3, CASE WHEN $3::timestamptz IS NOT NULL THEN 'applied' END
  FROM generate_series(1, $5::int) AS g`, prefix, received, processed, attempts, n)
	require.NoError(t, err)
}

// outbox inserts n outbox rows created at created and published at
// published (nil: unpublished).
func (b *testBundle) outbox(t *testing.T, n int, created time.Time, published *time.Time) {
	t.Helper()
	_, err := b.pool.Exec(context.Background(), `
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at, published_at)
SELECT 'Invoice', 'in_' || g, 'InvoicePaymentBooked', '{}', $1, $2
  FROM generate_series(1, $3::int) AS g`, created, published, n)
	require.NoError(t, err)
}

func ptr(t time.Time) *time.Time { return &t }

// t0 is the "now" of tests that inject it, at microsecond precision (what
// timestamptz keeps).
var t0 = time.Date(2031, 3, 15, 12, 0, 0, 0, time.UTC)

const day = retention.Day

func TestOlderThanRetentionIsStrict(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cutoff := t0.Add(-30 * day)
	for name, at := range map[string]time.Time{
		"evt_older_":   cutoff.Add(-time.Microsecond), // just past the retention: deleted
		"evt_at_":      cutoff,                        // exactly 30 days old: kept
		"evt_younger_": cutoff.Add(time.Microsecond),  // not yet 30 days old: kept
	} {
		b.receipts(t, name, 1, at.Add(-time.Minute), ptr(at), 1)
		b.outbox(t, 1, at.Add(-time.Minute), ptr(at))
	}

	s := b.purge(t, b.newPurger(t, nil, retention.Config{Retention: 30 * day}, &t0))
	require.Equal(t, cutoff, s.Cutoff.UTC())
	require.EqualValues(t, 1, s.PurgedReceipts)
	require.EqualValues(t, 1, s.PurgedOutbox)
	require.Equal(t, 0, b.db.Count(t, "webhook_inbox", "event_id = 'evt_older_1'"))
	require.Equal(t, 2, b.db.Count(t, "webhook_inbox", "event_id IN ('evt_at_1', 'evt_younger_1')"))
	require.Equal(t, 0, b.db.Count(t, "outbox", "published_at < $1", cutoff))
	require.Equal(t, 2, b.db.Count(t, "outbox", "published_at >= $1", cutoff))

	// A day later the row that was exactly at the boundary goes too.
	later := t0.Add(day)
	s = b.purge(t, b.newPurger(t, nil, retention.Config{Retention: 30 * day}, &later))
	require.EqualValues(t, 2, s.PurgedReceipts)
	require.EqualValues(t, 2, s.PurgedOutbox)
}

func TestOnlyProcessedReceiptsAndPublishedOutboxRowsAreDeleted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	old := t0.Add(-100 * day)
	b.receipts(t, "evt_unprocessed_", 3, old, nil, 0)
	b.receipts(t, "evt_review_", 2, old, nil, worker.DefaultMaxAttempts) // needs review: attempts at the limit
	b.receipts(t, "evt_done_", 4, old, ptr(old), 1)
	b.outbox(t, 5, old, nil) // never published
	b.outbox(t, 6, old, ptr(old))
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, `
INSERT INTO anomalies (kind, subject_id, endpoint, event_id, created_at, resolved_at, resolution)
VALUES ('payment_on_void_invoice', 'in_open', 'billing', 'evt_a1', $1, NULL, NULL),
       ('payment_on_void_invoice', 'in_done', 'billing', 'evt_a2', $1, $1, 'refunded by hand')`, old)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `INSERT INTO ledger_entries (invoice_id, kind, amount, event_id, created_at) VALUES ('in_1', 'payment', 100, 'evt_done_1', $1)`, old)
	require.NoError(t, err)

	s := b.purge(t, b.newPurger(t, nil, retention.Config{ScrubAfter: 7 * day}, &t0))
	require.EqualValues(t, 4, s.PurgedReceipts)
	require.EqualValues(t, 6, s.PurgedOutbox)
	require.EqualValues(t, 0, s.ScrubbedPayloads, "scrubbing never touches unprocessed receipts")

	require.Equal(t, 5, b.db.Count(t, "webhook_inbox", "processed_at IS NULL"))
	require.Equal(t, 2, b.db.Count(t, "webhook_inbox", "attempts = $1", worker.DefaultMaxAttempts))
	require.Equal(t, 5, b.db.Count(t, "webhook_inbox", "payload ? 'customer_email'"), "unprocessed payloads are intact")
	require.Equal(t, 0, b.db.Count(t, "webhook_inbox", "processed_at IS NOT NULL"))
	require.Equal(t, 5, b.db.Count(t, "outbox", "published_at IS NULL"))
	require.Equal(t, 0, b.db.Count(t, "outbox", "published_at IS NOT NULL"))
	require.Equal(t, 2, b.db.Count(t, "anomalies", ""))
	require.Equal(t, 1, b.db.Count(t, "ledger_entries", ""))
}

func TestBatchesUntilOneComesBackShort(t *testing.T) {
	t.Parallel()
	b := setup(t)
	old := t0.Add(-40 * day)
	b.receipts(t, "evt_", 2500, old, ptr(old), 1)
	b.receipts(t, "evt_new_", 10, t0, ptr(t0), 1)

	s := b.purge(t, b.newPurger(t, nil, retention.Config{BatchSize: 1000}, &t0))
	require.EqualValues(t, 2500, s.PurgedReceipts)
	require.Equal(t, 3, s.Batches, "1000 + 1000 + 500; the empty outbox adds none")
	require.False(t, s.StoppedAtDeadline)
	require.Equal(t, 10, b.db.Count(t, "webhook_inbox", ""))

	// An exact multiple: the statement that finds nothing left is not a batch.
	b.outbox(t, 2000, old, ptr(old))
	s = b.purge(t, b.newPurger(t, nil, retention.Config{BatchSize: 1000}, &t0))
	require.EqualValues(t, 0, s.PurgedReceipts)
	require.EqualValues(t, 2000, s.PurgedOutbox)
	require.Equal(t, 2, s.Batches)
}

func TestRedeliveryAfterThePurgeBooksNothingNew(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	w := b.newWorker(t)
	ev := stripetest.Event("evt_paid", "invoice.paid", stripetest.Invoice("in_1", "cus_1", "paid", 1000))
	require.Equal(t, inbox.Stored, b.receive(t, ev))
	s, err := w.Run(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, s.Processed)
	require.Equal(t, 1, b.db.Count(t, "outbox", ""))
	// The dispatcher has published the notification.
	_, err = b.pool.Exec(ctx, "UPDATE outbox SET published_at = now()")
	require.NoError(t, err)

	// 31 days later both are gone.
	later := time.Now().Add(31 * day)
	ps := b.purge(t, b.newPurger(t, nil, retention.Config{}, &later))
	require.EqualValues(t, 1, ps.PurgedReceipts)
	require.EqualValues(t, 1, ps.PurgedOutbox)

	// A redelivery after the retention is a new receipt again: this is what
	// the minimum retention guards against. The business keys still hold.
	require.Equal(t, inbox.Stored, b.receive(t, ev))
	s, err = w.Run(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, s.Processed)
	require.Equal(t, 1, b.db.Count(t, "ledger_entries", "invoice_id = 'in_1' AND kind = 'payment'"))
	require.Equal(t, 1, b.db.Count(t, "ledger_entries", ""))
	require.Equal(t, 0, b.db.Count(t, "outbox", ""), "no second notification")
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "event_id = 'evt_paid' AND processed_at IS NOT NULL"))
}

// gate makes the deletes of webhook_inbox rows by sessions that SET
// test.purge_gate = 'on' wait for the advisory lock gateKey, which the test
// holds: a purge batch on such a session stops inside its DELETE, after its
// subquery has locked its rows, for as long as the test wants.
const gateKey = 0x7075726765

func installGate(t *testing.T, b *testBundle) {
	t.Helper()
	_, err := b.pool.Exec(context.Background(), fmt.Sprintf(`
CREATE FUNCTION purge_gate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('test.purge_gate', true) = 'on' THEN
        PERFORM pg_advisory_xact_lock_shared(%d);
    END IF;
    RETURN OLD;
END $$;
CREATE TRIGGER purge_gate BEFORE DELETE ON webhook_inbox
    FOR EACH ROW EXECUTE FUNCTION purge_gate();`, gateKey))
	require.NoError(t, err)
}

func TestReceiptsClaimsAndAnotherPurgeProceedWhileABatchHoldsItsLocks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	old := time.Now().Add(-40 * day)
	b.receipts(t, "evt_old_", 20000, old, ptr(old), 1)
	b.outbox(t, 3000, old, ptr(old))
	installGate(t, b)

	gate := b.db.Connect(t)
	_, err := gate.Exec(ctx, "SELECT pg_advisory_lock($1)", gateKey)
	require.NoError(t, err)

	// Purge A runs on its own connection, in small batches, and stops inside
	// its first DELETE holding the locks of 500 receipts.
	connA := b.db.Connect(t)
	_, err = connA.Exec(ctx, "SET test.purge_gate = 'on'")
	require.NoError(t, err)
	type result struct {
		s   retention.Summary
		err error
	}
	doneA := make(chan result, 1)
	purgerA := b.newPurger(t, connA, retention.Config{BatchSize: 500}, nil)
	go func() {
		s, err := purgerA.Run(ctx)
		doneA <- result{s, err}
	}()
	waitForAdvisoryWaiter(t, b.db)

	// Meanwhile new receipts are stored and the worker claims and processes
	// them, on other connections.
	for i := range 40 {
		ev := stripetest.Event(fmt.Sprintf("evt_new_%02d", i), "invoice.paid", stripetest.Invoice(fmt.Sprintf("in_%02d", i), "cus_1", "paid", 1000))
		require.Equal(t, inbox.Stored, b.receive(t, ev))
	}
	ws, err := b.newWorker(t).Run(ctx)
	require.NoError(t, err)
	require.Equal(t, 40, ws.Processed)
	require.Equal(t, 0, ws.Failed)
	require.Equal(t, 40, b.db.Count(t, "ledger_entries", ""))

	// A second purge (say, a duplicate delivery of the schedule) skips the
	// rows A holds instead of queueing behind them, and finishes.
	// (Bounded so that a purge that waited would fail here, not hang.)
	ctxB, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	sB, err := b.newPurger(t, nil, retention.Config{BatchSize: 500, DeadlineMargin: time.Second}, nil).Run(ctxB)
	require.NoError(t, err)
	require.EqualValues(t, 20000-500, sB.PurgedReceipts)
	require.EqualValues(t, 3000, sB.PurgedOutbox)

	select {
	case r := <-doneA:
		t.Fatalf("purge A finished while its batch was held: %+v, %v", r.s, r.err)
	default:
	}
	_, err = gate.Exec(ctx, "SELECT pg_advisory_unlock($1)", gateKey)
	require.NoError(t, err)
	rA := <-doneA
	require.NoError(t, rA.err)
	require.EqualValues(t, 500, rA.s.PurgedReceipts)
	require.EqualValues(t, 0, rA.s.PurgedOutbox)

	require.Equal(t, 0, b.db.Count(t, "webhook_inbox", "event_id LIKE 'evt_old_%'"))
	require.Equal(t, 40, b.db.Count(t, "webhook_inbox", "event_id LIKE 'evt_new_%' AND processed_at IS NOT NULL"))
	require.Equal(t, 40, b.db.Count(t, "outbox", "published_at IS NULL"))
}

func waitForAdvisoryWaiter(t *testing.T, db *pgtest.Database) {
	t.Helper()
	db.WaitUntil(t, "the purge reaches the gate",
		`SELECT count(*) > 0 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`)
}

func TestDeadlineMarginStopsBeforeTheNextBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	old := t0.Add(-40 * day)
	b.receipts(t, "evt_", 10, old, ptr(old), 1)
	p := b.newPurger(t, nil, retention.Config{DeadlineMargin: 10 * time.Second}, &t0)
	// Less time left than the margin: no batch starts.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := p.Run(ctx)
	require.NoError(t, err)
	require.True(t, s.StoppedAtDeadline)
	require.Zero(t, s.Batches)
	require.Equal(t, 10, b.db.Count(t, "webhook_inbox", ""))
	require.Contains(t, lastLine(t, b.metrics), `"PurgedReceipts":0`)
}

func TestScrubDropsPayloadsAndKeepsKeys(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	w := b.newWorker(t)
	// Two receipts processed by the worker, the way production does it.
	for _, id := range []string{"evt_a", "evt_b"} {
		require.Equal(t, inbox.Stored, b.receive(t, stripetest.Event(id, "invoice.paid", stripetest.Invoice("in_"+id, "cus_1", "paid", 1000))))
	}
	_, err := w.Run(ctx)
	require.NoError(t, err)
	processedAt := time.Now()
	b.receipts(t, "evt_unprocessed_", 1, processedAt.Add(-20*day), nil, 0)

	// Six days later: inside the scrub window, nothing is scrubbed.
	cfg := retention.Config{ScrubAfter: 7 * day, BatchSize: 1}
	now := processedAt.Add(6 * day)
	s := b.purge(t, b.newPurger(t, nil, cfg, &now))
	require.EqualValues(t, 0, s.ScrubbedPayloads)

	// Eight days later both are scrubbed, one batch each.
	now = processedAt.Add(8 * day)
	s = b.purge(t, b.newPurger(t, nil, cfg, &now))
	require.EqualValues(t, 2, s.ScrubbedPayloads)
	require.EqualValues(t, 0, s.PurgedReceipts)
	require.Equal(t, 2, s.Batches)
	require.Equal(t, now.Add(-7*day).UTC().Truncate(time.Microsecond), s.ScrubCutoff.UTC())

	var payload, eventType string
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT payload::text, event_type FROM webhook_inbox WHERE event_id = 'evt_a'").Scan(&payload, &eventType))
	require.JSONEq(t, `{"scrubbed": true}`, payload)
	require.Equal(t, "invoice.paid", eventType)
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "processed_at IS NULL AND payload ? 'customer_email'"), "unprocessed payloads are never scrubbed")

	// It terminates: scrubbed rows are not picked again.
	s = b.purge(t, b.newPurger(t, nil, cfg, &now))
	require.EqualValues(t, 0, s.ScrubbedPayloads)
	require.Equal(t, 0, s.Batches)

	// The key stays: a redelivery is still a duplicate and books nothing.
	require.Equal(t, inbox.Duplicate, b.receive(t, stripetest.Event("evt_a", "invoice.paid", stripetest.Invoice("in_evt_a", "cus_1", "paid", 1000))))
	ws, err := w.Run(ctx)
	require.NoError(t, err)
	require.Zero(t, ws.Processed)
	require.Equal(t, 2, b.db.Count(t, "ledger_entries", ""))
}

func TestSummaryLogAndMetrics(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.receipts(t, "evt_old_", 3, t0.Add(-40*day), ptr(t0.Add(-40*day)), 1)
	b.receipts(t, "evt_mid_", 2, t0.Add(-10*day), ptr(t0.Add(-10*day)), 1)
	b.outbox(t, 4, t0.Add(-40*day), ptr(t0.Add(-40*day)))

	s := b.purge(t, b.newPurger(t, nil, retention.Config{ScrubAfter: 7 * day}, &t0))
	require.Equal(t, retention.Summary{
		PurgedReceipts: 3, PurgedOutbox: 4, ScrubbedPayloads: 2, Batches: 3,
		Cutoff: t0.Add(-30 * day), ScrubCutoff: t0.Add(-7 * day), DurationMs: s.DurationMs,
	}, normalise(s))

	out, err := json.Marshal(s)
	require.NoError(t, err)
	var got map[string]any
	require.NoError(t, json.Unmarshal(out, &got))
	for k, v := range map[string]any{"purged_receipts": 3.0, "purged_outbox": 4.0, "scrubbed_payloads": 2.0, "batches": 3.0, "stopped_at_deadline": false} {
		require.Equal(t, v, got[k], k)
	}
	require.Contains(t, got, "duration_ms")
	require.Contains(t, got, "cutoff")

	var emf map[string]any
	require.NoError(t, json.Unmarshal([]byte(lastLine(t, b.metrics)), &emf))
	require.EqualValues(t, 3, emf["PurgedReceipts"])
	require.EqualValues(t, 4, emf["PurgedOutbox"])
	require.EqualValues(t, 2, emf["ScrubbedPayloads"])
	require.Contains(t, emf, "PurgeDurationMs")
	require.Equal(t, "purge", emf["Service"])
	def := emf["_aws"].(map[string]any)["CloudWatchMetrics"].([]any)[0].(map[string]any)
	require.Equal(t, "Test", def["Namespace"])
	require.ElementsMatch(t, []any{
		map[string]any{"Name": "PurgedReceipts", "Unit": "Count"},
		map[string]any{"Name": "PurgedOutbox", "Unit": "Count"},
		map[string]any{"Name": "PurgeDurationMs", "Unit": "Milliseconds"},
		map[string]any{"Name": "ScrubbedPayloads", "Unit": "Count"},
	}, def["Metrics"])

	var logLine map[string]any
	require.NoError(t, json.Unmarshal([]byte(lastLine(t, b.logs)), &logLine))
	require.Equal(t, "purge", logLine["msg"])
	require.EqualValues(t, 3, logLine["purged_receipts"])
	require.EqualValues(t, 4, logLine["purged_outbox"])
	require.EqualValues(t, 2, logLine["scrubbed_payloads"])
	require.EqualValues(t, 3, logLine["batches"])
	require.Contains(t, logLine, "duration_ms")

	// With scrubbing off there is no ScrubbedPayloads metric.
	b.purge(t, b.newPurger(t, nil, retention.Config{}, &t0))
	require.NotContains(t, lastLine(t, b.metrics), "ScrubbedPayloads")
	require.Contains(t, lastLine(t, b.metrics), `"PurgedReceipts":0`)
}

// normalise puts s's times in UTC so that Equal compares instants.
func normalise(s retention.Summary) retention.Summary {
	s.Cutoff, s.ScrubCutoff = s.Cutoff.UTC(), s.ScrubCutoff.UTC()
	return s
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	require.NoError(t, retention.Config{}.WithDefaults().Validate())
	require.NoError(t, retention.Config{Retention: 4 * day, ScrubAfter: 0}.WithDefaults().Validate())
	err := retention.Config{Retention: 3 * day, BatchSize: 0, ScrubAfter: 2 * day, DeadlineMargin: -time.Second}.Validate()
	require.ErrorContains(t, err, "RETENTION_DAYS=3: must be at least 4 days: Stripe retries a webhook for up to 3 days")
	require.ErrorContains(t, err, "PURGE_BATCH_SIZE=0")
	require.ErrorContains(t, err, "SCRUB_PAYLOAD_AFTER_DAYS=2: must be 0 (off) or at least 4 days")
	require.ErrorContains(t, err, "DEADLINE_MARGIN=-1s")
	require.ErrorContains(t, retention.Config{Retention: 30 * day, ScrubAfter: 30 * day}.WithDefaults().Validate(),
		"SCRUB_PAYLOAD_AFTER_DAYS=30 must be shorter than RETENTION_DAYS=30")
}

func lastLine(t *testing.T, buf *bytes.Buffer) string {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.NotEmpty(t, lines[len(lines)-1], "nothing written")
	return lines[len(lines)-1]
}

// TestScrubClearsTheRawBytes: a receipt whose text jsonb could not hold keeps
// its exact bytes in payload_raw; scrubbing its payload clears those too.
func TestScrubClearsTheRawBytes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	body := stripetest.Event("evt_raw", "invoice.paid", stripetest.Invoice("in_raw", "cus_1", "paid", 1000))
	body = []byte(strings.Replace(string(body), `"customer":"cus_1"`, `"customer":"cus_1","customer_name":"Ann\u0000Lee \ud800"`, 1))
	require.Equal(t, inbox.Stored, b.receive(t, body))
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "event_id = 'evt_raw' AND payload_raw IS NOT NULL"))
	_, err := b.newWorker(t).Run(ctx)
	require.NoError(t, err)
	processedAt := time.Now()

	now := processedAt.Add(8 * day)
	s := b.purge(t, b.newPurger(t, nil, retention.Config{ScrubAfter: 7 * day}, &now))
	require.EqualValues(t, 1, s.ScrubbedPayloads)
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", `event_id = 'evt_raw' AND payload_raw IS NULL AND payload = '{"scrubbed": true}'::jsonb`),
		"the exact bytes are scrubbed with the payload")
}

// Done write-back intents (superseded ones included) older than the
// retention are deleted; pending and parked ones, and younger done ones,
// stay. Safe: the ledger entry, not the intent, keeps a redelivered payment
// from recording a second intent (the handler records one only when it
// books the payment).
func TestDoneWritebackIntentsPastTheRetentionAreDeleted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	old, young := t0.Add(-31*day), t0.Add(-29*day)
	_, err := b.pool.Exec(context.Background(), `
INSERT INTO writeback_intents (kind, target, params, idempotency_key, event_id, status, done_at, result_via, created_at)
VALUES ('customer_metadata', 'cus_1', '{"metadata": {"k": "v"}}', 'k_done_old', 'evt_1', 'done', $1, 'call', $1),
       ('customer_metadata', 'cus_1', '{"metadata": {"k": "v"}}', 'k_superseded_old', 'evt_2', 'done', $1, 'superseded', $1),
       ('customer_metadata', 'cus_1', '{"metadata": {"k": "v"}}', 'k_done_young', 'evt_3', 'done', $2, 'call', $1),
       ('customer_metadata', 'cus_1', '{"metadata": {"k": "v"}}', 'k_pending_old', 'evt_4', 'pending', NULL, NULL, $1),
       ('customer_metadata', 'cus_1', '{"metadata": {"k": "v"}}', 'k_parked_old', 'evt_5', 'parked', NULL, NULL, $1)`, old, young)
	require.NoError(t, err)
	s := b.purge(t, b.newPurger(t, nil, retention.Config{Retention: 30 * day}, &t0))
	require.EqualValues(t, 2, s.PurgedWritebacks)
	require.Equal(t, 0, b.db.Count(t, "writeback_intents", "idempotency_key IN ('k_done_old', 'k_superseded_old')"))
	require.Equal(t, 3, b.db.Count(t, "writeback_intents", ""))
}
