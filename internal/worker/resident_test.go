package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
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
	"github.com/stripe-inbox/inbox/internal/stripeevent"
	"github.com/stripe-inbox/inbox/internal/stripetest"
	"github.com/stripe-inbox/inbox/internal/worker"
)

// idleWatch is a slog.Handler that counts the resident worker's "worker
// idle" records (it logs one each time it starts waiting for receipts), and
// those written while its listener was registered: tests wait for those
// states instead of sleeping.
type idleWatch struct {
	idle, idleListening atomic.Int64
	stopped             atomic.Int64
	pollFailed          atomic.Int64 // "polling for receipts failed" records

	mu       sync.Mutex
	warnings []string // the worker's warnings and errors, for a failure's message
}

// reported is what the worker warned of, for a test that gave up waiting.
func (h *idleWatch) reported() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.warnings) == 0 {
		return "the worker logged no warning"
	}
	return "the worker logged: " + strings.Join(h.warnings, "; ")
}

func (h *idleWatch) Enabled(context.Context, slog.Level) bool { return true }
func (h *idleWatch) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *idleWatch) WithGroup(string) slog.Handler            { return h }
func (h *idleWatch) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		var b strings.Builder
		b.WriteString(r.Message)
		r.Attrs(func(a slog.Attr) bool {
			fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
			return true
		})
		h.mu.Lock()
		h.warnings = append(h.warnings, b.String())
		h.mu.Unlock()
	}
	switch r.Message {
	case "worker idle":
		h.idle.Add(1)
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "listening" && a.Value.Bool() {
				h.idleListening.Add(1)
			}
			return true
		})
	case "worker resident stopped":
		h.stopped.Add(1)
	case "polling for receipts failed":
		h.pollFailed.Add(1)
	}
	return nil
}

// waitFor waits until cond holds (at most 30 s, as pgtest.WaitUntil). The
// failure's message has what watch recorded, when there is one.
func waitFor(t *testing.T, what string, cond func() bool, watch ...*idleWatch) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			for _, w := range watch {
				t.Log(w.reported())
			}
			t.Fatalf("gave up waiting until %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// residentWorker is newWorker with the log going to an idleWatch.
func (b *testBundle) residentWorker(t *testing.T, pool *pgxpool.Pool, cfg worker.Config) (*worker.Worker, *idleWatch) {
	t.Helper()
	cfg.Mode = worker.ModeTest
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
		cfg.BatchSize = b.batchSize
	}
	cfg = cfg.WithDefaults()
	require.NoError(t, cfg.Validate())
	watch := &idleWatch{}
	em := metrics.New(io.Discard, "Test", map[string]string{"Service": "worker"}) // two workers may share b
	w, err := worker.New(pool, handlers.Default(), cfg, slog.New(watch), em)
	require.NoError(t, err)
	return w, watch
}

// run starts w.Run on ctx and returns a function that waits for its result.
func runAsync(ctx context.Context, w *worker.Worker) func() (worker.Summary, error) {
	var (
		s   worker.Summary
		err error
		wg  sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		s, err = w.Run(ctx)
	}()
	return func() (worker.Summary, error) { wg.Wait(); return s, err }
}

func storeEvent(t *testing.T, db inbox.DB, payload []byte, notify bool) {
	t.Helper()
	ev, err := stripeevent.Verify(payload, stripetest.Sign(payload, time.Now(), "whsec_test"), []string{"whsec_test"})
	require.NoError(t, err)
	store := inbox.Store
	if notify {
		store = inbox.StoreAndNotify
	}
	out, err := store(context.Background(), db, "billing", ev)
	require.NoError(t, err)
	require.Equal(t, inbox.Stored, out)
}

// TestResidentWorkerPicksUpAReceiptStoredWhileItIdles: with the inbox
// drained, a resident worker keeps polling; a receipt stored while it waits
// is processed in the same invocation, without a notification.
func TestResidentWorkerPicksUpAReceiptStoredWhileItIdles(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, watch := b.residentWorker(t, b.pool, worker.Config{Concurrency: 2, PollInterval: 10 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	wait := runAsync(ctx, w)

	waitFor(t, "the worker idles", func() bool { return watch.idle.Load() > 0 }, watch)
	storeEvent(t, b.pool, paid("evt_idle", "in_idle"), false)
	b.db.WaitUntil(t, "the receipt is processed", "SELECT count(*) = 1 FROM webhook_inbox WHERE event_id = 'evt_idle' AND processed_at IS NOT NULL")
	idle := watch.idle.Load()
	waitFor(t, "the worker idles again", func() bool { return watch.idle.Load() > idle }, watch)
	cancel()
	s, err := wait()
	require.NoError(t, err)
	require.Equal(t, 1, s.Processed)
	require.Equal(t, 1, b.db.Count(t, "ledger_entries", "invoice_id = 'in_idle'"))
	require.EqualValues(t, 1, watch.stopped.Load())
}

// TestResidentWorkerWakesOnNotification: with a poll interval of an hour,
// only the webhook's notification can make the idle worker claim the
// receipt before the test gives up.
func TestResidentWorkerWakesOnNotification(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, watch := b.residentWorker(t, b.pool, worker.Config{Concurrency: 2, PollInterval: time.Hour, Listen: true})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	wait := runAsync(ctx, w)

	// Idle with the LISTEN registered: the listener's own first wake-up
	// (a look for what came before the LISTEN) is over too.
	waitFor(t, "the worker idles while listening", func() bool { return watch.idleListening.Load() > 0 }, watch)
	for i := range 3 {
		idle := watch.idleListening.Load()
		storeEvent(t, b.pool, paid(fmt.Sprintf("evt_n%d", i), fmt.Sprintf("in_n%d", i)), true)
		b.db.WaitUntil(t, "the notified receipt is processed",
			fmt.Sprintf("SELECT count(*) = 1 FROM webhook_inbox WHERE event_id = 'evt_n%d' AND processed_at IS NOT NULL", i))
		waitFor(t, "the worker idles again", func() bool { return watch.idleListening.Load() > idle }, watch)
	}
	cancel()
	s, err := wait()
	require.NoError(t, err)
	require.Equal(t, 3, s.Processed)
}

// TestResidentWorkerStopsAtTheMarginAndGivesBackUnstartedClaims: a resident
// worker stops at the deadline minus the margin, returns before the
// deadline, and gives back the claims it had not started.
func TestResidentWorkerStopsAtTheMarginAndGivesBackUnstartedClaims(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 3 {
		b.receive(t, paid(fmt.Sprintf("evt_m%d", i), fmt.Sprintf("in_m%d", i)))
	}
	// Generous: the claim must come before the margin (after connecting),
	// and the rest (the handler's statements, the release, the reads at
	// the end) within it, however busy the machine.
	const margin = 10 * time.Second
	reg := handlers.Default()
	real := reg["invoice.paid"]
	// The first receipt's handler returns only once the margin is reached
	// (the state under test), with the other two claimed and not started.
	reg["invoice.paid"] = handlers.HandlerFunc(func(ctx context.Context, tx handlers.DB, ev handlers.Event) (handlers.Result, error) {
		d, _ := ctx.Deadline()
		for time.Now().Before(d.Add(-margin)) {
			time.Sleep(10 * time.Millisecond)
		}
		return real(ev)(ctx, tx)
	})
	cfg := worker.Config{Mode: worker.ModeTest, Concurrency: 1, ClaimLimit: 3, BatchSize: 1, StatementTimeout: time.Second,
		DeadlineMargin: margin, Lease: time.Minute, PollInterval: 10 * time.Millisecond}.WithDefaults()
	require.NoError(t, cfg.Validate())
	watch := &idleWatch{}
	w, err := worker.New(b.pool, reg, cfg, slog.New(watch), metrics.New(b.metrics, "Test", nil))
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), margin+8*time.Second)
	defer cancel()
	s, err := w.Run(ctx)
	require.NoError(t, err)
	require.NoError(t, ctx.Err(), "the run returned before its deadline")
	require.Equal(t, 1, s.Processed)
	require.Equal(t, 2, s.Released)
	require.Equal(t, 2, b.db.Count(t, "webhook_inbox", "processed_at IS NULL AND attempts = 0 AND available_at <= now()"),
		"the unstarted claims are claimable again, their attempt uncounted")
	require.EqualValues(t, 1, watch.stopped.Load())
}

// TestResidentWorkerWithNothingToDoReturnsBeforeItsDeadline: an idle
// resident worker polls until the margin and returns before the deadline.
func TestResidentWorkerWithNothingToDoReturnsBeforeItsDeadline(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Generous: the run connects, claims, listens and idles before the
	// margin (5 s), and returns within it (10 s), however busy the machine.
	w, watch := b.residentWorker(t, b.pool, worker.Config{PollInterval: 10 * time.Millisecond, DeadlineMargin: 10 * time.Second, Listen: true})
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	s, err := w.Run(ctx)
	require.NoError(t, err)
	require.NoError(t, ctx.Err(), "the run returned before its deadline")
	require.Zero(t, s.Processed)
	require.EqualValues(t, 1, watch.stopped.Load())
	require.Positive(t, watch.idle.Load())
}

// lockInbox takes an ACCESS EXCLUSIVE lock on webhook_inbox (as a
// migration's ALTER TABLE would) in a transaction of its own, and returns
// the function that ends it (also called at cleanup).
func (b *testBundle) lockInbox(t *testing.T) (unlock func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := b.db.Connect(t).Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "LOCK TABLE webhook_inbox IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)
	var once sync.Once
	unlock = func() { once.Do(func() { require.NoError(t, tx.Rollback(ctx)) }) }
	t.Cleanup(unlock)
	return unlock
}

// TestResidentRunReturnsBeforeItsDeadlineWhileALockBlocksItsPolls: another
// session holds an ACCESS EXCLUSIVE lock on webhook_inbox while a resident
// run idles, until after the run's deadline. Every poll waits on the lock:
// the statement timeout ends each one, the margin ends the run, and the
// reads at the end give up before the deadline, so the run returns in time
// and counts the failed polls. Before, the poll waited on the invocation's
// context: the run overran its margin and its deadline, and reported
// nothing.
func TestResidentRunReturnsBeforeItsDeadlineWhileALockBlocksItsPolls(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, watch := b.residentWorker(t, b.pool, worker.Config{PollInterval: 10 * time.Millisecond, StatementTimeout: time.Second, DeadlineMargin: 10 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	wait := runAsync(ctx, w)

	waitFor(t, "the worker idles", func() bool { return watch.idle.Load() > 0 }, watch)
	b.lockInbox(t)
	s, err := wait()
	require.NoError(t, ctx.Err(), "the run returned before its deadline")
	require.NoError(t, err, "the database could be used (the first claim and polls worked): failed polls do not fail the run")
	require.Positive(t, s.PollErrors)
	require.Positive(t, watch.pollFailed.Load())
	require.EqualValues(t, 1, watch.stopped.Load())
}

// TestTwoOverlappingResidentWorkersProcessEachReceiptOnce: two resident
// invocations (each with a pool of its own, as two Lambda execution
// environments have) overlap while receipts keep arriving: every receipt is
// processed, and none twice.
func TestTwoOverlappingResidentWorkersProcessEachReceiptOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	poolB, err := database.Open(context.Background(), database.Config{URL: b.db.URL, MaxConns: 10, PreparedStatements: true}, nil)
	require.NoError(t, err)
	t.Cleanup(poolB.Close)
	wA, watchA := b.residentWorker(t, b.pool, worker.Config{Concurrency: 3, ClaimLimit: 5, PollInterval: 10 * time.Millisecond, Listen: true})
	wB, watchB := b.residentWorker(t, poolB, worker.Config{Concurrency: 3, ClaimLimit: 5, PollInterval: 10 * time.Millisecond})

	ctxA, cancelA := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancelA()
	waitA := runAsync(ctxA, wA)
	const n = 200
	for i := range n / 2 {
		storeEvent(t, b.pool, paid(fmt.Sprintf("evt_o%d", i), fmt.Sprintf("in_o%d", i)), i%2 == 0)
	}
	ctxB, cancelB := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancelB()
	waitB := runAsync(ctxB, wB)
	for i := n / 2; i < n; i++ {
		storeEvent(t, b.pool, paid(fmt.Sprintf("evt_o%d", i), fmt.Sprintf("in_o%d", i)), i%2 == 0)
	}
	b.db.WaitUntil(t, "every receipt is processed", fmt.Sprintf("SELECT count(*) = %d FROM webhook_inbox WHERE processed_at IS NOT NULL", n))
	for _, w := range []*idleWatch{watchA, watchB} {
		idle := w.idle.Load()
		waitFor(t, "the worker idles", func() bool { return w.idle.Load() > idle })
	}
	cancelA()
	sA, errA := waitA()
	cancelB()
	sB, errB := waitB()
	require.NoError(t, errA)
	require.NoError(t, errB)
	require.Equal(t, n, sA.Processed+sB.Processed, "A processed %d, B %d", sA.Processed, sB.Processed)
	require.Equal(t, n, b.db.Count(t, "ledger_entries", ""))
	require.Equal(t, n, b.db.Count(t, "outbox", ""))
	require.Equal(t, n, b.db.Count(t, "webhook_inbox", "attempts = 1"), "no receipt was attempted twice")
}

// TestLatencyIsEmittedPerReceipt: each processed receipt's processed_at -
// received_at is one value of ReceiptToEffectSeconds.
func TestLatencyIsEmittedPerReceipt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 3 {
		b.receive(t, paid(fmt.Sprintf("evt_l%d", i), fmt.Sprintf("in_l%d", i)))
	}
	b.receive(t, stripetest.Event("evt_l_other", "customer.created", map[string]any{"id": "cus_2"}))
	w := b.newWorker(t, nil, worker.Config{Concurrency: 1})
	later := future() // processed a minute after the receipts
	w.Now = at(later)
	s := b.run(t, w)
	require.Equal(t, 3, s.Processed)
	var values []float64
	for _, line := range strings.Split(strings.TrimSpace(b.metrics.String()), "\n") {
		var emf map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &emf))
		if vs, ok := emf["ReceiptToEffectSeconds"].([]any); ok {
			for _, v := range vs {
				values = append(values, v.(float64))
			}
		}
	}
	require.Len(t, values, 4, "one value per receipt marked processed (applied and ignored)")
	for _, v := range values {
		require.GreaterOrEqual(t, v, 59.0)
	}
}

// TestResidentRunOutlivesFailedPolls: polls fail for a while (a lock on
// webhook_inbox past the statement timeout), then the lock goes away. The
// run counts the failures, processes the receipt stored afterwards, and
// returns no error: one failed poll among the hundreds of a resident run
// must not fail the invocation (and page). Before, the first failed poll
// was the run's error.
func TestResidentRunOutlivesFailedPolls(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, watch := b.residentWorker(t, b.pool, worker.Config{PollInterval: 10 * time.Millisecond, StatementTimeout: 200 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wait := runAsync(ctx, w)

	waitFor(t, "the worker idles", func() bool { return watch.idle.Load() > 0 }, watch)
	unlock := b.lockInbox(t)
	waitFor(t, "a poll fails", func() bool { return watch.pollFailed.Load() > 0 }, watch)
	unlock()
	storeEvent(t, b.pool, paid("evt_after", "in_after"), false)
	b.db.WaitUntil(t, "the receipt is processed", "SELECT count(*) = 1 FROM webhook_inbox WHERE event_id = 'evt_after' AND processed_at IS NOT NULL")
	cancel()
	s, err := wait()
	require.NoError(t, err)
	require.Positive(t, s.PollErrors)
	require.Equal(t, 1, s.Processed)
	require.Equal(t, 1, b.db.Count(t, "ledger_entries", "invoice_id = 'in_after'"))
}

// TestRunReturnsBeforeItsDeadlineWhileALockBlocksItsClaims: the same lock,
// held from before a scheduled run until after its deadline: the statement
// timeout ends each drainer's claim (the database could not be used, so the
// run fails), and the run still returns before its deadline.
func TestRunReturnsBeforeItsDeadlineWhileALockBlocksItsClaims(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.receive(t, paid("evt_locked", "in_locked"))
	w := b.newWorker(t, nil, worker.Config{Concurrency: 2, StatementTimeout: time.Second, DeadlineMargin: 10 * time.Second})
	b.lockInbox(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := w.Run(ctx)
	require.NoError(t, ctx.Err(), "the run returned before its deadline")
	require.ErrorContains(t, err, "claiming receipts", "no claim succeeded: the database could not be used")
	require.Zero(t, s.Processed)
	require.Equal(t, 2, s.PollErrors, "one failed claim per drainer")
}
