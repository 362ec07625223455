// Package opstest fills a test database with what the operator commands
// must show: processed receipts with their effects (an invoice, a ledger
// entry, an outbox row), an anomaly, and unprocessed receipts in every
// state (backlog, failed, needs review), on two endpoints, signed with two
// secrets. The receipts are stored as the webhook stores them and the
// effects are the worker's own. Tests of internal/ops, internal/opscli and
// e2e use it; production code never imports it.
package opstest

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/database"
	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/stripeevent"
	"github.com/stripe-inbox/inbox/internal/stripetest"
	"github.com/stripe-inbox/inbox/internal/worker"
)

// The fixture's secrets: billing's deliveries were verified by the new
// secret of a roll except one by the old; connect's by its own.
const (
	SecretNew     = "whsec_fixture_new"
	SecretOld     = "whsec_fixture_old"
	SecretConnect = "whsec_fixture_connect"
	// OtherAPIVersion is the version of one receipt (Other).
	OtherAPIVersion = "2099-01-01.future"
	// MaxAttempts is the fixture's MAX_ATTEMPTS.
	MaxAttempts = 10
)

// The fixture's event ids.
const (
	Paid        = "evt_fx_paid"      // invoice.paid in_fx_1 on billing: applied, ledger + outbox; also on connect
	Created     = "evt_fx_created"   // invoice.created in_fx_1: applied
	Voided      = "evt_fx_voided"    // invoice.voided in_fx_2: applied
	PaidOnVoid  = "evt_fx_paid_void" // invoice.paid in_fx_2: applied, booked (ledger + outbox), raised the anomaly
	Backlog     = "evt_fx_backlog"   // invoice.finalized, unprocessed, never tried
	Failed1     = "evt_fx_failed_1"  // refund.created, 2 attempts, last_error "pg 40P01: deadlock detected", due again
	Failed2     = "evt_fx_failed_2"  // refund.created on connect, 3 attempts, last_error "pg 57014: statement timeout", held 5 more minutes
	NeedsReview = "evt_fx_review"    // charge.refunded, 10 attempts, last_error "bad_payload: no charge id"
	Other       = "evt_fx_other"     // customer.updated of OtherAPIVersion on connect: processed (ignored)
)

// TestBundle is a filled database (the test bundle every operator test
// starts from).
type TestBundle struct {
	DB *pgtest.Database
	// AnomalyID is the open anomaly (payment_on_void_invoice of in_fx_2).
	AnomalyID int64
	// The outbox, besides the InvoicePaymentBooked rows of evt_fx_paid and
	// evt_fx_paid_void (unpublished, never tried: backlog). OutboxWaiting: two rows that used up
	// MaxAttempts and wait for a human (InvoicePaymentBooked of in_fx_w1,
	// older, and in_fx_w2, last_error "MalformedDetail: ..."); OutboxFailing:
	// one still being tried (3 attempts, due in a minute: backlog);
	// OutboxPublished: one published at its last attempt (attempts =
	// MaxAttempts), which no command may list or retry.
	OutboxWaiting   []int64
	OutboxFailing   int64
	OutboxPublished int64
}

// OutboxError is the last_error of the fixture's waiting outbox rows.
const OutboxError = "MalformedDetail: detail is not valid JSON"

// Seed fills db.
func Seed(t *testing.T, db *pgtest.Database) TestBundle {
	t.Helper()
	ctx := context.Background()
	store := func(endpoint, secret string, payload []byte) {
		t.Helper()
		ev, err := stripeevent.Verify(payload, stripetest.Sign(payload, time.Now(), secret), []string{secret})
		require.NoError(t, err)
		out, err := inbox.Store(ctx, db.Pool, endpoint, ev)
		require.NoError(t, err)
		if out == inbox.Duplicate { // as the webhook does
			_, err = inbox.CountDuplicate(ctx, db.Pool, endpoint, ev.ID)
			require.NoError(t, err)
		}
	}
	inv1 := stripetest.Invoice("in_fx_1", "cus_fx", "open", 2500)
	store("billing", SecretOld, stripetest.Event(Created, "invoice.created", inv1))
	store("billing", SecretNew, stripetest.Event(Paid, "invoice.paid", stripetest.Invoice("in_fx_1", "cus_fx", "paid", 2500)))
	store("billing", SecretNew, stripetest.Event(Paid, "invoice.paid", stripetest.Invoice("in_fx_1", "cus_fx", "paid", 2500))) // a duplicate delivery
	store("connect", SecretConnect, stripetest.Event(Paid, "invoice.paid", stripetest.Invoice("in_fx_1", "cus_fx", "paid", 2500)))
	store("billing", SecretNew, stripetest.Event(Voided, "invoice.voided", stripetest.Invoice("in_fx_2", "cus_fx", "void", 700)))
	var other map[string]any
	require.NoError(t, json.Unmarshal(stripetest.Event(Other, "customer.updated", map[string]any{"id": "cus_fx", "object": "customer"}), &other))
	other["api_version"] = OtherAPIVersion
	otherJSON, err := json.Marshal(other)
	require.NoError(t, err)
	store("connect", SecretConnect, otherJSON)

	// Apply them, in two runs so that the void precedes the payment.
	runWorker(t, db)
	store("billing", SecretNew, stripetest.Event(PaidOnVoid, "invoice.paid", stripetest.Invoice("in_fx_2", "cus_fx", "paid", 700)))
	runWorker(t, db)

	// Unprocessed receipts, in the states a worker leaves them.
	store("billing", SecretNew, stripetest.Event(Backlog, "invoice.finalized", stripetest.Invoice("in_fx_3", "cus_fx", "open", 100)))
	store("billing", SecretNew, stripetest.Event(Failed1, "refund.created", stripetest.Refund("re_fx_1", "ch_fx_1", 100)))
	store("connect", SecretConnect, stripetest.Event(Failed2, "refund.created", stripetest.Refund("re_fx_2", "ch_fx_2", 100)))
	store("billing", SecretNew, stripetest.Event(NeedsReview, "charge.refunded", map[string]any{"object": "charge"}))
	for _, s := range []string{
		`UPDATE webhook_inbox SET attempts = 2, last_error = 'pg 40P01: deadlock detected', available_at = now() - interval '1 minute' WHERE event_id = '` + Failed1 + `'`,
		`UPDATE webhook_inbox SET attempts = 3, last_error = 'pg 57014: canceling statement due to statement timeout', available_at = now() + interval '5 minutes' WHERE event_id = '` + Failed2 + `'`,
		`UPDATE webhook_inbox SET attempts = 10, last_error = 'bad_payload: no charge id', available_at = 'infinity' WHERE event_id = '` + NeedsReview + `'`,
	} {
		_, err := db.Pool.Exec(ctx, s)
		require.NoError(t, err)
	}
	var f TestBundle
	f.DB = db
	outboxRow := func(aggregateID, state string) int64 {
		t.Helper()
		var id int64
		require.NoError(t, db.Pool.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at)
VALUES ('invoice', $1, 'InvoicePaymentBooked', jsonb_build_object('invoice_id', $1::text), now() - interval '10 minutes') RETURNING id`, aggregateID).Scan(&id))
		_, err := db.Pool.Exec(ctx, `UPDATE outbox SET `+state+` WHERE id = $1`, id)
		require.NoError(t, err)
		return id
	}
	waiting := "attempts = 10, available_at = 'infinity', last_error = '" + OutboxError + "'"
	f.OutboxWaiting = []int64{outboxRow("in_fx_w1", waiting+", created_at = now() - interval '20 minutes'"), outboxRow("in_fx_w2", waiting)}
	f.OutboxFailing = outboxRow("in_fx_f", "attempts = 3, available_at = now() + interval '1 minute', last_error = 'ThrottlingException'")
	f.OutboxPublished = outboxRow("in_fx_p", "attempts = 10, published_at = now(), last_error = NULL")
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT id FROM anomalies WHERE subject_id = 'in_fx_2'").Scan(&f.AnomalyID))
	return f
}

func runWorker(t *testing.T, db *pgtest.Database) {
	t.Helper()
	pool, err := database.Open(context.Background(), database.Config{URL: db.URL, MaxConns: 3, PreparedStatements: true}, nil)
	require.NoError(t, err)
	defer pool.Close()
	cfg := worker.Config{Mode: worker.ModeTest, Concurrency: 1, MaxAttempts: MaxAttempts, StatementTimeout: time.Second, DeadlineMargin: 2 * time.Second, Lease: time.Minute}.WithDefaults()
	require.NoError(t, cfg.Validate())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w, err := worker.New(pool, handlers.Default(), cfg, slog.New(slog.NewJSONHandler(io.Discard, nil)), nil)
	require.NoError(t, err)
	s, err := w.Run(ctx)
	require.NoError(t, err)
	require.Zero(t, s.Failed, "the fixture's processed receipts apply")
}

// Snapshot is every row of the tables the commands may change, as text:
// equal snapshots mean nothing changed.
func Snapshot(t *testing.T, db *pgtest.Database) string {
	t.Helper()
	var s string
	require.NoError(t, db.Pool.QueryRow(context.Background(), `
SELECT concat_ws(E'\n',
  (SELECT string_agg(w::text, E'\n' ORDER BY endpoint, event_id) FROM webhook_inbox w),
  (SELECT string_agg(a::text, E'\n' ORDER BY id) FROM anomalies a),
  (SELECT string_agg(o::text, E'\n' ORDER BY id) FROM ops_audit o),
  (SELECT string_agg(x::text, E'\n' ORDER BY id) FROM outbox x),
  (SELECT string_agg(l::text, E'\n' ORDER BY id) FROM ledger_entries l),
  (SELECT string_agg(i::text, E'\n' ORDER BY id) FROM invoices i))`).Scan(&s))
	return s
}
