package worker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/database"
	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/metrics"
	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/stripeevent"
	"github.com/stripe-inbox/inbox/internal/stripetest"
	"github.com/stripe-inbox/inbox/internal/worker"
)

type testBundle struct {
	db        *pgtest.Database
	pool      *pgxpool.Pool
	metrics   *bytes.Buffer
	batchSize int // 0: the default; INBOX_WORKER_BATCH_SIZE overrides
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	db := pgtest.DB(t)
	// As config.LoadWorker configures it.
	pool, err := database.Open(context.Background(), database.Config{URL: db.URL, MaxConns: 10, PreparedStatements: true}, nil)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return &testBundle{db: db, pool: pool, metrics: &bytes.Buffer{}, batchSize: testBatchSize(t)}
}

// newWorker builds a worker with test-friendly settings; cfg overrides them.
func (b *testBundle) newWorker(t *testing.T, reg handlers.Registry, cfg worker.Config) *worker.Worker {
	t.Helper()
	if cfg.Mode == "" {
		cfg.Mode = worker.ModeTest // the mode stripetest.Event's events are in
	}
	if cfg.StatementTimeout == 0 {
		cfg.StatementTimeout = time.Second
	}
	if cfg.DeadlineMargin == 0 {
		cfg.DeadlineMargin = 6 * time.Second
	}
	if cfg.Lease == 0 {
		cfg.Lease = time.Minute
	}
	if cfg.BatchSize == 0 && b.batchSize > 0 {
		cfg.BatchSize = b.batchSize // only ever 1 (TestEveryTestAtBatchSizeOne)
	}
	cfg = cfg.WithDefaults()
	require.NoError(t, cfg.Validate())
	if reg == nil {
		reg = handlers.Default()
	}
	em := metrics.New(b.metrics, "Test", map[string]string{"Service": "worker"})
	var logOut io.Writer = io.Discard
	if os.Getenv("INBOX_TEST_LOG") != "" {
		logOut = os.Stderr
	}
	w, err := worker.New(b.pool, reg, cfg, slog.New(slog.NewJSONHandler(logOut, nil)), em)
	require.NoError(t, err)
	return w
}

// receive stores an event as the webhook would: signed, verified, stored.
func (b *testBundle) receive(t *testing.T, payload []byte) {
	t.Helper()
	ev, err := stripeevent.Verify(payload, stripetest.Sign(payload, time.Now(), "whsec_test"), []string{"whsec_test"})
	require.NoError(t, err)
	_, err = inbox.Store(context.Background(), b.pool, "billing", ev)
	require.NoError(t, err)
}

func (b *testBundle) invoiceStatus(t *testing.T, id string) string {
	t.Helper()
	var s string
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT status FROM invoices WHERE id = $1", id).Scan(&s))
	return s
}

func (b *testBundle) run(t *testing.T, w *worker.Worker) worker.Summary {
	t.Helper()
	s, err := w.Run(context.Background())
	require.NoError(t, err)
	return s
}

func paid(evt, inv string) []byte {
	return stripetest.Event(evt, "invoice.paid", stripetest.Invoice(inv, "cus_1", "paid", 1000))
}

func at(ts time.Time) func() *time.Time { return func() *time.Time { return &ts } }

func TestPaidBeforeCreatedEndsPaid(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.receive(t, paid("evt_paid", "in_1"))
	b.receive(t, stripetest.Event("evt_created", "invoice.created", stripetest.Invoice("in_1", "cus_1", "draft", 1000)))
	b.receive(t, stripetest.Event("evt_final", "invoice.finalized", stripetest.Invoice("in_1", "cus_1", "open", 1000)))
	s := b.run(t, b.newWorker(t, nil, worker.Config{Concurrency: 1}))
	require.Equal(t, 3, s.Processed)
	require.Equal(t, "paid", b.invoiceStatus(t, "in_1"))
	require.Equal(t, 1, b.db.Count(t, "ledger_entries", "invoice_id = 'in_1' AND kind = 'payment' AND amount = 1000"))
}

func TestTwoEventObjectsForOnePaymentBookOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.receive(t, paid("evt_A", "in_1"))
	b.receive(t, paid("evt_B", "in_1"))
	s := b.run(t, b.newWorker(t, nil, worker.Config{Concurrency: 2}))
	require.Equal(t, 2, s.Processed)
	require.Equal(t, 1, b.db.Count(t, "ledger_entries", ""))
	require.Equal(t, 1, b.db.Count(t, "outbox", "aggregate_id = 'in_1' AND event_type = 'InvoicePaymentBooked'"), "one notification")
	require.Equal(t, 2, b.db.Count(t, "webhook_inbox", "processed_at IS NOT NULL AND outcome = 'applied'"))
}

// TestPaidOnVoidedInvoiceIsBookedAndRaisesAnomaly: a payment processed
// after a void is money that moved: the invoice becomes paid, the payment is
// booked once with one outbox row, and one anomaly tells a human (issue 23).
func TestPaidOnVoidedInvoiceIsBookedAndRaisesAnomaly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.receive(t, stripetest.Event("evt_void", "invoice.voided", stripetest.Invoice("in_v", "cus_1", "void", 500)))
	w := b.newWorker(t, nil, worker.Config{Concurrency: 1})
	b.run(t, w)
	b.receive(t, paid("evt_paid1", "in_v"))
	b.receive(t, paid("evt_paid2", "in_v")) // the same fact again, as another Event object
	s := b.run(t, w)

	require.Equal(t, "paid", b.invoiceStatus(t, "in_v"))
	require.Equal(t, 1, b.db.Count(t, "ledger_entries", "invoice_id = 'in_v' AND kind = 'payment' AND amount = 1000"))
	require.Equal(t, 1, b.db.Count(t, "ledger_entries", ""))
	require.Equal(t, 1, b.db.Count(t, "outbox", "aggregate_id = 'in_v' AND event_type = 'InvoicePaymentBooked'"))
	require.Equal(t, 1, b.db.Count(t, "outbox", ""))
	require.Equal(t, 1, b.db.Count(t, "anomalies", "kind = 'payment_on_void_invoice' AND subject_id = 'in_v' AND resolved_at IS NULL AND detail->>'first' = 'void'"))
	require.Equal(t, 1, s.Anomalies, "the second payment finds the invoice paid: nothing to raise")
	require.Equal(t, 1, s.UnresolvedAnomalies)
	require.Contains(t, lastEMF(t, b.metrics), `"AnomalyCount":1`)
}

func TestInvoiceTransitionsNeverGoBackwards(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := b.newWorker(t, nil, worker.Config{Concurrency: 1})
	// paid, then late voided / uncollectible / finalized / created: stays paid.
	b.receive(t, paid("evt_1", "in_p"))
	b.run(t, w)
	for i, typ := range []string{"invoice.voided", "invoice.marked_uncollectible", "invoice.finalized", "invoice.created"} {
		b.receive(t, stripetest.Event(fmt.Sprintf("evt_late_%d", i), typ, stripetest.Invoice("in_p", "cus_1", "open", 1000)))
	}
	b.run(t, w)
	require.Equal(t, "paid", b.invoiceStatus(t, "in_p"))

	// uncollectible then paid: Stripe allows it.
	b.receive(t, stripetest.Event("evt_u", "invoice.marked_uncollectible", stripetest.Invoice("in_u", "cus_1", "uncollectible", 700)))
	b.run(t, w)
	require.Equal(t, "uncollectible", b.invoiceStatus(t, "in_u"))
	b.receive(t, paid("evt_u_paid", "in_u"))
	b.run(t, w)
	require.Equal(t, "paid", b.invoiceStatus(t, "in_u"))

	// void is final, but for a payment (TestPaidOnVoidedInvoiceIsBookedAndRaisesAnomaly).
	b.receive(t, stripetest.Event("evt_v", "invoice.voided", stripetest.Invoice("in_v", "cus_1", "void", 700)))
	b.receive(t, stripetest.Event("evt_v2", "invoice.marked_uncollectible", stripetest.Invoice("in_v", "cus_1", "uncollectible", 700)))
	b.run(t, w)
	require.Equal(t, "void", b.invoiceStatus(t, "in_v"))
}

func TestRefundsBookOncePerRefundID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := b.newWorker(t, nil, worker.Config{Concurrency: 2})
	b.receive(t, paid("evt_p", "in_r"))
	b.receive(t, stripetest.Event("evt_r1", "charge.refunded", stripetest.ChargeWithRefunds("ch_1", "in_r", map[string]int64{"re_1": 300})))
	// A later charge.refunded lists both refunds; another Event object repeats it.
	both := stripetest.ChargeWithRefunds("ch_1", "in_r", map[string]int64{"re_1": 300, "re_2": 200})
	b.receive(t, stripetest.Event("evt_r2", "charge.refunded", both))
	b.receive(t, stripetest.Event("evt_r2_dup", "charge.refunded", both))
	// refund.created for the same refund, keyed to the charge rather than the invoice.
	b.receive(t, stripetest.Event("evt_rc", "refund.created", stripetest.Refund("re_2", "ch_1", 200)))
	b.run(t, w)

	require.Equal(t, 1, b.db.Count(t, "ledger_entries", "kind = 'refund:re_1' AND amount = -300"))
	require.Equal(t, 1, b.db.Count(t, "ledger_entries", "kind = 'refund:re_2' AND amount = -200"))
	require.Equal(t, 3, b.db.Count(t, "ledger_entries", ""))
}

func TestUnknownEventTypeIsMarkedIgnored(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.receive(t, stripetest.Event("evt_cust", "customer.updated", map[string]any{"id": "cus_1", "object": "customer"}))
	s := b.run(t, b.newWorker(t, nil, worker.Config{Concurrency: 1}))
	require.Equal(t, 1, s.Ignored)
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "outcome = 'ignored' AND processed_at IS NOT NULL AND attempts = 1"))
	require.Equal(t, 0, s.Remaining)
}

func TestFailureIsRecordedAndRetried(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls atomic.Int32
	reg := handlers.Default()
	real := reg["invoice.paid"]
	reg["invoice.paid"] = handlers.HandlerFunc(func(ctx context.Context, tx handlers.DB, ev handlers.Event) (handlers.Result, error) {
		// The business update runs, then fails: it must roll back.
		res, err := real(ev)(ctx, tx)
		if err != nil {
			return res, err
		}
		if calls.Add(1) == 1 {
			return handlers.Result{}, errors.New("ledger service exploded")
		}
		return res, nil
	})
	t0 := future()
	w := b.newWorker(t, reg, worker.Config{Concurrency: 1, BackoffBase: 10 * time.Second, BackoffCap: time.Minute})
	w.Now = at(t0)
	w.Jitter = func() float64 { return 0 }
	b.receive(t, paid("evt_f", "in_f"))

	s := b.run(t, w)
	require.Equal(t, 1, s.Failed)
	require.Equal(t, 1, s.Remaining)
	require.Equal(t, 0, b.db.Count(t, "ledger_entries", ""), "the failed attempt's booking rolled back")
	require.Equal(t, 0, b.db.Count(t, "invoices", ""))
	var attempts int
	var lastErr string
	var availableAt time.Time
	require.NoError(t, b.pool.QueryRow(context.Background(),
		"SELECT attempts, last_error, available_at FROM webhook_inbox WHERE event_id = 'evt_f'").Scan(&attempts, &lastErr, &availableAt))
	require.Equal(t, 1, attempts)
	require.Contains(t, lastErr, "ledger service exploded")
	require.Equal(t, t0.Add(5*time.Second), availableAt.UTC(), "backoff: base 10s x 2^0, jittered to 50%")

	// Not before the backoff ends.
	w.Now = at(t0.Add(4 * time.Second))
	require.Equal(t, 0, b.run(t, w).Processed)
	w.Now = at(t0.Add(5 * time.Second))
	s = b.run(t, w)
	require.Equal(t, 1, s.Processed)
	require.Equal(t, 1, b.db.Count(t, "ledger_entries", ""))
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "attempts = 2 AND last_error IS NULL AND processed_at IS NOT NULL"))
}

func TestBadPayloadUsesUpAttemptsAndWaitsForReview(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.receive(t, stripetest.Event("evt_bad", "invoice.paid", map[string]any{"object": "invoice"})) // no id
	w := b.newWorker(t, nil, worker.Config{Concurrency: 1, MaxAttempts: 3})
	w.Jitter = func() float64 { return 0 }
	now := future()
	for range 5 {
		w.Now = at(now)
		b.run(t, w)
		now = now.Add(time.Hour)
	}
	s := b.run(t, w)
	require.Equal(t, 1, s.NeedsReview)
	require.Equal(t, 0, s.Remaining)
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "attempts = 3 AND processed_at IS NULL AND last_error LIKE 'bad_payload:%'"))
	require.Contains(t, lastEMF(t, b.metrics), `"NeedsReviewCount":1`)

	// The operator's reset from the README (with this test's limit of 3):
	// the receipt is claimed again with a fresh count.
	tag, err := b.pool.Exec(context.Background(), `UPDATE webhook_inbox SET attempts = 0, available_at = now()
	 WHERE processed_at IS NULL AND attempts >= 3 AND event_id = 'evt_bad'`)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())
	w.Now = at(now)
	s = b.run(t, w)
	require.Equal(t, 1, s.Failed, "retried after the reset")
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "attempts = 1 AND processed_at IS NULL"))
}

func TestFiftyReceiptsAcrossFourDrainers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 50 {
		b.receive(t, paid(fmt.Sprintf("evt_%02d", i), fmt.Sprintf("in_%02d", i)))
	}
	s := b.run(t, b.newWorker(t, nil, worker.Config{Concurrency: 4, ClaimLimit: 2}))
	require.Equal(t, 50, s.Processed)
	require.Equal(t, 0, s.Failed)
	require.Equal(t, 0, s.Remaining)
	require.Equal(t, 50, b.db.Count(t, "ledger_entries", ""))
	require.Equal(t, 50, b.db.Count(t, "webhook_inbox", "processed_at IS NOT NULL AND attempts = 1"))
	require.Equal(t, 50, b.db.Count(t, "outbox", ""))
}

func TestCrashRightAfterClaimStopsAtTheLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.receive(t, paid("evt_poison", "in_x"))
	const limit = 3
	lease := time.Minute
	now := future()
	for i := 1; i <= limit; i++ {
		// A process claims it and dies before processing: the claim committed.
		conn := b.db.Connect(t)
		claimed, err := inbox.Claim(context.Background(), conn, inbox.ClaimParams{Now: &now, MaxAttempts: limit, Limit: 1, Lease: lease})
		require.NoError(t, err)
		require.Len(t, claimed, 1, "attempt %d", i)
		require.Equal(t, i, claimed[0].Attempts)
		require.NoError(t, conn.Close(context.Background()))

		// Within the lease nobody else can take it.
		again, err := inbox.Claim(context.Background(), b.pool, inbox.ClaimParams{Now: &now, MaxAttempts: limit, Limit: 1, Lease: lease})
		require.NoError(t, err)
		require.Empty(t, again)
		now = now.Add(lease + time.Second)
	}
	claimed, err := inbox.Claim(context.Background(), b.pool, inbox.ClaimParams{Now: &now, MaxAttempts: limit, Limit: 1, Lease: lease})
	require.NoError(t, err)
	require.Empty(t, claimed, "at the limit the receipt waits for a human")
	backlog, err := inbox.Stats(context.Background(), b.pool, limit, &now)
	require.NoError(t, err)
	require.Equal(t, inbox.Backlog{Count: 0, NeedsReview: 1}, backlog)
}

func TestLeaseExpiresAnotherWorkerCompletesFirstResumesAsNoOp(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.receive(t, paid("evt_lease", "in_l"))
	t0 := future()

	// Worker A claims, then stalls.
	connA := b.db.Connect(t)
	claimedA, err := inbox.Claim(context.Background(), connA, inbox.ClaimParams{Now: &t0, MaxAttempts: 10, Limit: 1, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, claimedA, 1)

	// The lease expires; worker B claims and completes it.
	wB := b.newWorker(t, nil, worker.Config{Concurrency: 1})
	wB.Now = at(t0.Add(61 * time.Second))
	s := b.run(t, wB)
	require.Equal(t, 1, s.Processed)

	// Worker A resumes.
	wA := b.newWorker(t, nil, worker.Config{Concurrency: 1})
	outcome, _ := wA.Process(context.Background(), connA, claimedA[0])
	require.Equal(t, worker.AlreadyDone, outcome)
	require.Equal(t, 1, b.db.Count(t, "ledger_entries", ""))
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "attempts = 2 AND processed_at IS NOT NULL AND last_error IS NULL"))
}

// TestPaidWhileAnotherTransactionVoidsTheInvoice: invoice.paid's statement
// takes its snapshot while the invoice is open, then waits for the row lock
// of a transaction that voids it. The transition to paid from open is
// refused on the voided row, so the status the snapshot saw (open) is
// stale: the handler must read the latest one (void), then book the payment
// on the void invoice and raise the anomaly, first "void".
func TestPaidWhileAnotherTransactionVoidsTheInvoice(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, "INSERT INTO invoices (id, customer_id, status) VALUES ('in_r', 'cus_1', 'open')")
	require.NoError(t, err)
	b.receive(t, paid("evt_race", "in_r"))

	voider, err := b.db.Connect(t).Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = voider.Rollback(ctx) })
	_, err = voider.Exec(ctx, "UPDATE invoices SET status = 'void' WHERE id = 'in_r'")
	require.NoError(t, err)

	w := b.newWorker(t, nil, worker.Config{Concurrency: 1})
	done := make(chan worker.Summary, 1)
	go func() {
		s, _ := w.Run(ctx)
		done <- s
	}()
	b.db.WaitForLockWaiter(t) // the payment's statement has its snapshot and waits
	require.NoError(t, voider.Commit(ctx))
	s := <-done
	require.Equal(t, 1, s.Processed)
	require.Equal(t, 1, s.Anomalies)
	require.Equal(t, "paid", b.invoiceStatus(t, "in_r"))
	require.Equal(t, 1, b.db.Count(t, "ledger_entries", "invoice_id = 'in_r' AND kind = 'payment' AND amount = 1000"))
	require.Equal(t, 1, b.db.Count(t, "ledger_entries", ""))
	require.Equal(t, 1, b.db.Count(t, "outbox", "aggregate_id = 'in_r' AND event_type = 'InvoicePaymentBooked'"))
	require.Equal(t, 1, b.db.Count(t, "anomalies", "kind = 'payment_on_void_invoice' AND subject_id = 'in_r' AND detail->>'first' = 'void'"))
}

func TestSecondWorkerWaitsForTheRowLockThenSeesItDone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.receive(t, paid("evt_wait", "in_w"))
	reached := make(chan struct{})
	release := make(chan struct{})
	reg := handlers.Default()
	real := reg["invoice.paid"]
	var once sync.Once
	reg["invoice.paid"] = handlers.HandlerFunc(func(ctx context.Context, tx handlers.DB, ev handlers.Event) (handlers.Result, error) {
		res, err := real(ev)(ctx, tx)
		once.Do(func() { close(reached); <-release })
		return res, err
	})
	claimed, err := inbox.Claim(context.Background(), b.pool, inbox.ClaimParams{MaxAttempts: 10, Limit: 1, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, claimed, 1)

	wA := b.newWorker(t, reg, worker.Config{Concurrency: 1})
	doneA := make(chan worker.Outcome, 1)
	go func() {
		o, _ := wA.Process(context.Background(), b.db.Connect(t), claimed[0])
		doneA <- o
	}()
	<-reached // A holds the row lock, its effect applied but not committed

	wB := b.newWorker(t, nil, worker.Config{Concurrency: 1})
	doneB := make(chan worker.Outcome, 1)
	go func() {
		o, _ := wB.Process(context.Background(), b.db.Connect(t), claimed[0])
		doneB <- o
	}()
	b.db.WaitForLockWaiter(t)
	close(release)
	require.Equal(t, worker.Applied, <-doneA)
	require.Equal(t, worker.AlreadyDone, <-doneB)
	require.Equal(t, 1, b.db.Count(t, "ledger_entries", ""))
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "last_error IS NULL AND processed_at IS NOT NULL"))
}

func TestStatementTimeoutIsRecordedAndRowStaysUnprocessed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.receive(t, paid("evt_slow", "in_s"))
	ctx := context.Background()
	reg := handlers.Default()
	real := reg["invoice.paid"]
	reg["invoice.paid"] = handlers.HandlerFunc(func(ctx context.Context, tx handlers.DB, ev handlers.Event) (handlers.Result, error) {
		res, err := real(ev)(ctx, tx)
		if err != nil {
			return res, err
		}
		// Business work slower than the statement timeout.
		_, err = tx.Exec(ctx, "SELECT pg_sleep(5)")
		return res, err
	})
	w := b.newWorker(t, reg, worker.Config{Concurrency: 1, StatementTimeout: 200 * time.Millisecond, DeadlineMargin: time.Second, Lease: 12 * time.Second})
	s := b.run(t, w)
	require.Equal(t, 1, s.Failed)
	var lastErr string
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT last_error FROM webhook_inbox WHERE event_id = 'evt_slow' AND processed_at IS NULL AND attempts = 1").Scan(&lastErr))
	require.True(t, strings.HasPrefix(lastErr, "pg 57014:"), lastErr)
	require.Equal(t, 0, b.db.Count(t, "ledger_entries", ""), "the booking rolled back")
	require.Equal(t, 0, b.db.Count(t, "invoices", ""))
}

func TestFailureRecordingGivesUpWhenAnotherWorkerHoldsTheRow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.receive(t, paid("evt_held", "in_h"))
	ctx := context.Background()
	claimed, err := inbox.Claim(ctx, b.pool, inbox.ClaimParams{MaxAttempts: 10, Limit: 1, Lease: time.Minute})
	require.NoError(t, err)

	// Another session holds the row for longer than the statement timeout:
	// processing times out waiting for the lock, and so does recording the
	// failure; the call returns instead of hanging, the row keeps its lease.
	holder := b.db.Connect(t)
	tx, err := holder.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "SELECT 1 FROM webhook_inbox WHERE event_id = 'evt_held' FOR UPDATE")
	require.NoError(t, err)
	w := b.newWorker(t, nil, worker.Config{Concurrency: 1, StatementTimeout: 200 * time.Millisecond, DeadlineMargin: time.Second, Lease: 12 * time.Second})
	conn := b.db.Connect(t)
	outcome, _ := w.Process(ctx, conn, claimed[0])
	require.Equal(t, worker.Failed, outcome)
	require.NoError(t, conn.Ping(ctx), "the drainer's connection survives the timeouts")
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "processed_at IS NULL AND attempts = 1"))
	require.Equal(t, 0, b.db.Count(t, "ledger_entries", ""))
}

func TestDeadlineMarginStopsClaiming(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 3 {
		b.receive(t, paid(fmt.Sprintf("evt_d%d", i), fmt.Sprintf("in_d%d", i)))
	}
	w := b.newWorker(t, nil, worker.Config{Concurrency: 2})
	// Less time left than the margin (6s): nothing is claimed.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := w.Run(ctx)
	require.NoError(t, err)
	require.Equal(t, 0, s.Processed)
	require.Equal(t, 3, s.Remaining)
	require.Equal(t, 3, b.db.Count(t, "webhook_inbox", "attempts = 0"))
}

func TestReleaseGivesBackUnstartedClaims(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 3 {
		b.receive(t, paid(fmt.Sprintf("evt_r%d", i), fmt.Sprintf("in_r%d", i)))
	}
	ctx := context.Background()
	claimed, err := inbox.Claim(ctx, b.pool, inbox.ClaimParams{MaxAttempts: 10, Limit: 3, Lease: time.Hour})
	require.NoError(t, err)
	require.Len(t, claimed, 3)
	released, err := inbox.Release(ctx, b.pool, claimed[1:], nil)
	require.NoError(t, err)
	require.Equal(t, 2, released)
	require.Equal(t, 2, b.db.Count(t, "webhook_inbox", "attempts = 0 AND available_at <= now()"))
	again, err := inbox.Claim(ctx, b.pool, inbox.ClaimParams{MaxAttempts: 10, Limit: 3, Lease: time.Hour})
	require.NoError(t, err)
	require.Len(t, again, 2)
}

func TestSummaryAndMetrics(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.receive(t, paid("evt_1", "in_1"))
	b.receive(t, stripetest.Event("evt_2", "customer.created", map[string]any{"id": "cus_2"}))
	b.receive(t, stripetest.Event("evt_3", "invoice.paid", map[string]any{"object": "invoice"}))
	b.receive(t, stripetest.EventWith("evt_4", "invoice.paid", stripetest.Meta{Livemode: true}, stripetest.Invoice("in_4", "cus_4", "paid", 100)))
	w := b.newWorker(t, nil, worker.Config{Concurrency: 1, MaxAttempts: 2})
	w.Jitter = func() float64 { return 0 }
	// The run's clock is a minute after the receipts, so the oldest age is
	// at least that, whatever the machine's speed.
	later := time.Now().Add(time.Minute)
	w.Now = func() *time.Time { return &later }
	s := b.run(t, w)
	require.Equal(t, 1, s.Processed)
	require.Equal(t, 1, s.Ignored)
	require.Equal(t, 1, s.IgnoredOtherMode)
	require.Equal(t, 1, s.Failed)
	require.Equal(t, 1, s.Remaining)
	require.GreaterOrEqual(t, s.OldestAgeSeconds, 59.0)

	var emf map[string]any
	require.NoError(t, json.Unmarshal([]byte(lastEMF(t, b.metrics)), &emf))
	require.EqualValues(t, 1, emf["Processed"])
	require.EqualValues(t, 1, emf["Ignored"])
	require.EqualValues(t, 1, emf["IgnoredOtherMode"])
	require.EqualValues(t, 1, emf["Failed"])
	require.EqualValues(t, 1, emf["BacklogCount"])
	require.EqualValues(t, 0, emf["NeedsReviewCount"])
	require.EqualValues(t, 0, emf["AnomalyCount"])
	require.GreaterOrEqual(t, emf["OldestUnprocessedAgeSeconds"], 59.0)
	require.Equal(t, "worker", emf["Service"])
	aws := emf["_aws"].(map[string]any)
	def := aws["CloudWatchMetrics"].([]any)[0].(map[string]any)
	require.Equal(t, "Test", def["Namespace"])
	require.Equal(t, []any{[]any{"Service"}}, def["Dimensions"])
	require.EqualValues(t, 0, emf["PollErrors"])
	require.EqualValues(t, 0, emf["Deadlocks"])
	require.Len(t, def["Metrics"], 10)

	out, err := json.Marshal(s)
	require.NoError(t, err)
	require.Contains(t, string(out), `"remaining":1`)
	require.Contains(t, string(out), `"ignored_other_mode":1`)
}

func lastEMF(t *testing.T, buf *bytes.Buffer) string {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.NotEmpty(t, lines[len(lines)-1], "no EMF line written")
	return lines[len(lines)-1]
}

// future is a "now" safely after the receipts' received_at, at microsecond
// precision (what timestamptz keeps).
func future() time.Time { return time.Now().UTC().Truncate(time.Millisecond).Add(time.Minute) }
