package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/database"
	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/stripetest"
	"github.com/stripe-inbox/inbox/internal/worker"
)

// Failures that must stay with their own receipt: a misbehaving handler in
// the middle of a batch of ordinary ones (test.note, see waveRegistry) fails
// only its own receipt, on both processing paths (TestEveryTestAtBatchSizeOne
// re-runs these at batch size 1).

// misbehavingRegistry adds to waveRegistry's handlers:
//   - test.panic writes a note, then panics;
//   - test.panic_first panics before any statement;
//   - test.panic_rows panics with the rows of a query still open;
//   - test.panic_reading panics while it reads the event, before it returns
//     its Booking (the worker reads outside the batch's jobs);
//   - test.unpreparable's first statement fails when it is prepared (before
//     it runs);
//   - test.unencodable's first statement has an argument that cannot be
//     encoded (it fails before it is sent);
//   - test.swallow writes a note, then a statement that fails, ignores the
//     error and returns success: the transaction is aborted;
//   - test.lost_connection writes a note, then its session is terminated.
func misbehavingRegistry(t *testing.T) handlers.Registry {
	reg := waveRegistry(t)
	note := func(ctx context.Context, tx handlers.DB, id string) error {
		_, err := tx.Exec(ctx, "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('Test', $1, 'note', '{}')", id)
		return err
	}
	then := func(second func(ctx context.Context, tx handlers.DB, ev handlers.Event) error) handlers.Handler {
		return handlers.HandlerFunc(func(ctx context.Context, tx handlers.DB, ev handlers.Event) (handlers.Result, error) {
			if err := note(ctx, tx, ev.ID); err != nil {
				return handlers.Result{}, err
			}
			return handlers.Result{Outcome: handlers.Applied}, second(ctx, tx, ev)
		})
	}
	// As a handler's first statement, sent in a wave with the other
	// receipts' first statements: the whole wave fails.
	reg["test.unpreparable"] = handlers.HandlerFunc(func(ctx context.Context, tx handlers.DB, ev handlers.Event) (handlers.Result, error) {
		_, err := tx.Exec(ctx, "UPDATE outbox SET no_such_column = 1 WHERE aggregate_id = $1", ev.ID)
		return handlers.Result{Outcome: handlers.Applied}, err
	})
	reg["test.unencodable"] = handlers.HandlerFunc(func(ctx context.Context, tx handlers.DB, ev handlers.Event) (handlers.Result, error) {
		_, err := tx.Exec(ctx, "UPDATE outbox SET event_type = $2 WHERE aggregate_id = $1", ev.ID, make(chan int))
		return handlers.Result{Outcome: handlers.Applied}, err
	})
	reg["test.swallow"] = then(func(ctx context.Context, tx handlers.DB, ev handlers.Event) error {
		_, _ = tx.Exec(ctx, "INSERT INTO invoices (id, status) VALUES ($1, 'paid')", ev.ID) // customer_id is NOT NULL
		return nil
	})
	reg["test.lost_connection"] = then(func(ctx context.Context, tx handlers.DB, ev handlers.Event) error {
		_, err := tx.Exec(ctx, "SELECT pg_terminate_backend(pg_backend_pid())")
		return err
	})
	reg["test.panic"] = handlers.HandlerFunc(func(ctx context.Context, tx handlers.DB, ev handlers.Event) (handlers.Result, error) {
		if _, err := tx.Exec(ctx, "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('Test', $1, 'note', '{}')", ev.ID); err != nil {
			return handlers.Result{}, err
		}
		var m map[string]int
		m[ev.ID]++ //nolint:staticcheck // SA5000: a nil map, the handler bug under test
		return handlers.Result{Outcome: handlers.Applied}, nil
	})
	reg["test.panic_first"] = handlers.HandlerFunc(func(ctx context.Context, tx handlers.DB, ev handlers.Event) (handlers.Result, error) {
		panic(fmt.Sprintf("cannot handle %s", ev.ID))
	})
	reg["test.panic_rows"] = handlers.HandlerFunc(func(ctx context.Context, tx handlers.DB, ev handlers.Event) (handlers.Result, error) {
		rows, err := tx.Query(ctx, "SELECT aggregate_id FROM outbox")
		if err != nil {
			return handlers.Result{}, err
		}
		_ = rows
		panic("left its rows open") // the connection is busy until they are read
	})
	reg["test.panic_reading"] = func(ev handlers.Event) handlers.Booking {
		panic(fmt.Sprintf("cannot read %s", ev.ID))
	}
	return reg
}

// receiveAround stores e1, e2 (of type middle), e3, e4, e5: batches run in
// object-id order, which here is event-id order, so the culprit is in the
// middle of the batch.
func (b *testBundle) receiveAround(t *testing.T, middle string) {
	t.Helper()
	b.receive(t, stripetest.Event("e1", "test.note", map[string]any{"id": "e1"}))
	b.receive(t, stripetest.Event("e2", middle, map[string]any{"id": "e2"}))
	for _, id := range []string{"e3", "e4", "e5"} {
		b.receive(t, stripetest.Event(id, "test.note", map[string]any{"id": id}))
	}
}

// requireOnlyE2Failed checks that e1, e3, e4 and e5 took effect once, with
// the one attempt their claim counted, and that e2 alone is unprocessed, its
// failure recorded (last_error LIKE lastError), its statements rolled back.
func (b *testBundle) requireOnlyE2Failed(t *testing.T, s worker.Summary, lastError string) {
	t.Helper()
	require.Equal(t, 4, s.Processed)
	require.Equal(t, 1, s.Failed)
	for _, id := range []string{"e1", "e3", "e4", "e5"} {
		require.Equal(t, 1, b.db.Count(t, "outbox", "aggregate_id = $1", id), id)
	}
	require.Equal(t, 0, b.db.Count(t, "outbox", "aggregate_id = 'e2'"), "the culprit's statements rolled back")
	require.Equal(t, 4, b.db.Count(t, "webhook_inbox", "processed_at IS NOT NULL AND attempts = 1 AND last_error IS NULL"))
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "event_id = 'e2' AND processed_at IS NULL AND attempts = 1 AND last_error LIKE $1", lastError),
		"the culprit's failure is recorded on it")
}

// TestHandlerPanicFailsOnlyItsReceipt: a handler that panics (after a
// statement, before any, or while it reads the event) does not end the process; the panic is that
// receipt's failure, with its value and the stack of the handler in
// last_error, and the batch goes on.
func TestHandlerPanicFailsOnlyItsReceipt(t *testing.T) {
	for _, tc := range []struct{ typ, lastError string }{
		{"test.panic", "panic: assignment to entry in nil map%misbehavingRegistry.%isolation_test.go:%"},
		{"test.panic_first", "panic: cannot handle e2%misbehavingRegistry.%isolation_test.go:%"},
		{"test.panic_rows", "panic: left its rows open%misbehavingRegistry.%isolation_test.go:%"},
		{"test.panic_reading", "panic: cannot read e2%misbehavingRegistry.%isolation_test.go:%"},
	} {
		t.Run(tc.typ, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.receiveAround(t, tc.typ)
			w := b.newWorker(t, misbehavingRegistry(t), worker.Config{Concurrency: 1, ClaimLimit: 5})
			b.requireOnlyE2Failed(t, b.run(t, w), tc.lastError)
		})
	}
}

// TestBatchTransactionFailureFailsOnlyTheCulprit: a handler that breaks the
// batch's transaction itself (not only its own statements) fails only its
// own receipt. The batch falls back to one transaction per receipt (on a
// new connection when the old one was lost), so the others are applied in
// this run with the attempt their claim counted, and the culprit's failure
// is recorded on it. Before, the whole batch failed and came back together.
func TestBatchTransactionFailureFailsOnlyTheCulprit(t *testing.T) {
	for _, tc := range []struct{ typ, lastError string }{
		{"test.unpreparable", "pg 42703:%no_such_column%"},
		{"test.unencodable", "%chan int%"},
		{"test.swallow", "pg 25P02:%"},
		{"test.lost_connection", "pg 57P01:%"},
	} {
		t.Run(tc.typ, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.receiveAround(t, tc.typ)
			// A terminated session sends its error before it has released
			// its locks: the next transaction may wait for them, briefly.
			w := b.newWorker(t, misbehavingRegistry(t), worker.Config{Concurrency: 1, ClaimLimit: 5, StatementTimeout: 5 * time.Second, DeadlineMargin: 10 * time.Second})
			b.requireOnlyE2Failed(t, b.run(t, w), tc.lastError)
		})
	}
}

// TestBatchFallbackPastTheMarginGivesTheReceiptsBack: a batch transaction
// fails (a handler aborted it) when the invocation is already within its
// deadline margin. The one-transaction-per-receipt fallback does not start
// them: it gives them back with their attempt uncounted, and records no
// failure on any of them (not even the culprit, which is not known yet).
// Before, it processed every receipt of the batch past the margin, where the
// end of the invocation could fail receipts that did nothing wrong.
func TestBatchFallbackPastTheMarginGivesTheReceiptsBack(t *testing.T) {
	for _, culprit := range []string{"test.swallow", "test.unpreparable"} {
		t.Run(culprit, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.receiveAround(t, culprit)
			ctx := context.Background()
			claimed, err := inbox.Claim(ctx, b.pool, inbox.ClaimParams{MaxAttempts: 10, Limit: 5, Lease: time.Minute})
			require.NoError(t, err)
			require.Len(t, claimed, 5)

			margin := 10 * time.Minute // at most 15m (worker.Config.Validate)
			w := b.newWorker(t, misbehavingRegistry(t), worker.Config{Concurrency: 1, DeadlineMargin: margin})
			// The deadline is already within the margin (as if the batch had
			// run into it), far enough away that the batch is not cut short.
			inMargin, cancel := context.WithDeadline(ctx, time.Now().Add(margin/2))
			defer cancel()
			outcomes, _ := w.ProcessBatch(inMargin, b.db.Connect(t), claimed)
			for i, o := range outcomes {
				require.Equal(t, worker.Released, o, claimed[i].EventID)
			}
			require.Equal(t, 5, b.db.Count(t, "webhook_inbox", "processed_at IS NULL AND attempts = 0 AND last_error IS NULL AND available_at <= now()"),
				"given back, attempt uncounted, no failure recorded, claimable at once")
			require.Equal(t, 0, b.db.Count(t, "outbox", ""))

			// The next invocation processes them as usual.
			s := b.run(t, w)
			require.Equal(t, 4, s.Processed)
			require.Equal(t, 1, s.Failed)
		})
	}
}

// TestBatchSplitPastTheMarginGivesTheRestBack: a batch transaction closes
// early (its first receipt took longer than the statement timeout), and by
// then the invocation's deadline margin has come. The rest of the batch is
// not started in another transaction: it is given back, attempts
// uncounted. A receipt of it that another worker has claimed since (its
// lease had expired) is not released, and is not counted as released.
// Before, the next transaction processed the rest past the margin, and a
// give-back counted every receipt as released even when it was not.
func TestBatchSplitPastTheMarginGivesTheRestBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// evt_s0's object sorts last in the batch, evt_s1's first.
	for i, inv := range []string{"in_sz", "in_sa", "in_sb", "in_sc", "in_sd"} {
		b.receive(t, paid(fmt.Sprintf("evt_s%d", i), inv))
	}
	ctx := context.Background()
	const lease = time.Minute
	t0 := future()
	first, err := inbox.Claim(ctx, b.pool, inbox.ClaimParams{Now: &t0, MaxAttempts: 10, Limit: 1, Lease: lease})
	require.NoError(t, err)
	require.Len(t, first, 1)
	require.Equal(t, "evt_s0", first[0].EventID)
	t1 := t0.Add(10 * time.Second)
	rest, err := inbox.Claim(ctx, b.pool, inbox.ClaimParams{Now: &t1, MaxAttempts: 10, Limit: 4, Lease: lease})
	require.NoError(t, err)
	require.Len(t, rest, 4)
	// Another worker claims evt_s0 again once its lease has expired (the
	// others' leases have not).
	t2 := t0.Add(lease + time.Second)
	other, err := inbox.Claim(ctx, b.pool, inbox.ClaimParams{Now: &t2, MaxAttempts: 10, Limit: 5, Lease: lease})
	require.NoError(t, err)
	require.Len(t, other, 1)
	require.Equal(t, "evt_s0", other[0].EventID)

	const margin = 10 * time.Minute // at most 15m (worker.Config.Validate)
	const statementTimeout = 100 * time.Millisecond
	stopAt := time.Now().Add(time.Second)
	reg := handlers.Default()
	real := reg["invoice.paid"]
	// The batch's first receipt (in_sa) returns once the margin has come
	// and the statement timeout has passed since it started, so the
	// transaction takes no other receipt and commits.
	reg["invoice.paid"] = handlers.HandlerFunc(func(ctx context.Context, tx handlers.DB, ev handlers.Event) (handlers.Result, error) {
		if ev.ID == "evt_s1" {
			started := time.Now()
			for time.Now().Before(stopAt) || time.Since(started) < statementTimeout {
				time.Sleep(10 * time.Millisecond)
			}
		}
		return real(ev)(ctx, tx)
	})
	w := b.newWorker(t, reg, worker.Config{Concurrency: 1, ClaimLimit: 5, BatchSize: 5, StatementTimeout: statementTimeout, DeadlineMargin: margin})
	dctx, cancel := context.WithDeadline(ctx, stopAt.Add(margin))
	defer cancel()
	batch := append(first, rest...)
	outcomes, _ := w.ProcessBatch(dctx, b.db.Connect(t), batch)
	got := map[string]worker.Outcome{}
	for i, o := range outcomes {
		got[batch[i].EventID] = o
	}
	require.Equal(t, map[string]worker.Outcome{
		"evt_s1": worker.Applied,
		"evt_s2": worker.Released, "evt_s3": worker.Released, "evt_s4": worker.Released,
		"evt_s0": "", // the other worker's now: not released, not counted
	}, got)
	require.Equal(t, 1, b.db.Count(t, "ledger_entries", ""))
	require.Equal(t, 3, b.db.Count(t, "webhook_inbox", "processed_at IS NULL AND attempts = 0 AND last_error IS NULL AND available_at <= now()"),
		"given back, attempt uncounted, no failure recorded, claimable at once")
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "event_id = 'evt_s0' AND processed_at IS NULL AND attempts = 2 AND available_at = $1", t2.Add(lease)),
		"the other worker's claim is left alone")
}

// TestLateReleaseLeavesTheNextClaimAlone: worker A claims a receipt and
// stalls past its lease; worker B claims it again. When A wakes up at the
// end of its invocation and gives back what it did not start, B's claim is
// not undone: its attempt stays counted and the receipt stays hidden for
// B's lease.
func TestLateReleaseLeavesTheNextClaimAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.receive(t, paid("evt_rel", "in_rel"))
	ctx := context.Background()
	lease := time.Minute
	t0 := future()
	claimA, err := inbox.Claim(ctx, b.db.Connect(t), inbox.ClaimParams{Now: &t0, MaxAttempts: 10, Limit: 1, Lease: lease})
	require.NoError(t, err)
	require.Len(t, claimA, 1)

	t1 := t0.Add(lease + time.Second) // A's lease has expired
	claimB, err := inbox.Claim(ctx, b.db.Connect(t), inbox.ClaimParams{Now: &t1, MaxAttempts: 10, Limit: 1, Lease: lease})
	require.NoError(t, err)
	require.Len(t, claimB, 1)
	require.Equal(t, 2, claimB[0].Attempts)

	released, err := inbox.Release(ctx, b.pool, claimA, &t1)
	require.NoError(t, err)
	require.Zero(t, released, "A's claim is no longer A's")
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "event_id = 'evt_rel' AND attempts = 2 AND available_at = $1", t1.Add(lease)))
	again, err := inbox.Claim(ctx, b.pool, inbox.ClaimParams{Now: &t1, MaxAttempts: 10, Limit: 1, Lease: lease})
	require.NoError(t, err)
	require.Empty(t, again, "B's lease still hides the receipt")

	// B's own release works.
	released, err = inbox.Release(ctx, b.pool, claimB, &t1)
	require.NoError(t, err)
	require.Equal(t, 1, released)
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "event_id = 'evt_rel' AND attempts = 1 AND available_at = $1", t1))
}

// TestMetricsSurviveADrainersClaimError: a drainer's claim fails (a lock
// held on the table makes it run out of lock_timeout, as a claim can time
// out in production) after the run processed a receipt. The run counts the
// error (PollErrors; the database could be used, so it is not the run's
// error), and still emits its counts, and each gauge it could read: with an
// EXCLUSIVE lock the backlog can still be read (a plain SELECT), with an
// ACCESS EXCLUSIVE lock it cannot, and only the backlog gauges are missing.
// Before, one drainer's error suppressed every metric of the run.
func TestMetricsSurviveADrainersClaimError(t *testing.T) {
	for _, mode := range []string{"EXCLUSIVE", "ACCESS EXCLUSIVE"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			// The worker's sessions give up waiting for a lock after 200ms.
			sep := " " // a keyword/value DSN
			if strings.Contains(b.db.URL, "://") {
				sep = "?"
				if strings.Contains(b.db.URL, "?") {
					sep = "&"
				}
			}
			pool, err := database.Open(ctx, database.Config{URL: b.db.URL + sep + "lock_timeout=200ms", MaxConns: 4, PreparedStatements: true}, nil)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			b.pool = pool

			for i := 1; i <= 3; i++ {
				b.receive(t, paid(fmt.Sprintf("evt_m%d", i), fmt.Sprintf("in_m%d", i)))
			}
			// While the first receipt is processed, another session asks
			// for the lock on the inbox: it gets it when that receipt
			// commits, and keeps it, so the next claim (SELECT ... FOR
			// UPDATE) waits and times out.
			holder, err := b.db.Connect(t).Begin(ctx)
			require.NoError(t, err)
			t.Cleanup(func() { _ = holder.Rollback(ctx) })
			locked := make(chan error, 1)
			reg := handlers.Default()
			real := reg["invoice.paid"]
			var once sync.Once
			reg["invoice.paid"] = handlers.HandlerFunc(func(ctx context.Context, tx handlers.DB, ev handlers.Event) (handlers.Result, error) {
				var err error
				once.Do(func() {
					go func() {
						_, err := holder.Exec(ctx, "LOCK TABLE webhook_inbox IN "+mode+" MODE")
						locked <- err
					}()
					for waiting := false; !waiting && err == nil; time.Sleep(10 * time.Millisecond) {
						err = b.db.Pool.QueryRow(ctx, "SELECT count(*) > 0 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE 'LOCK TABLE%'").Scan(&waiting)
					}
				})
				if err != nil {
					return handlers.Result{}, err
				}
				return real(ev)(ctx, tx)
			})
			w := b.newWorker(t, reg, worker.Config{Concurrency: 1, ClaimLimit: 1})
			s, err := w.Run(ctx)
			require.NoError(t, err, "the first claim worked: a failed claim is counted, not the run's error")
			require.NoError(t, <-locked)
			require.Equal(t, 1, s.Processed)
			require.Equal(t, 1, s.PollErrors)

			var emf map[string]any
			require.NoError(t, json.Unmarshal([]byte(lastEMF(t, b.metrics)), &emf))
			require.EqualValues(t, 1, emf["Processed"])
			require.EqualValues(t, 0, emf["Failed"])
			require.EqualValues(t, 0, emf["Ignored"])
			require.EqualValues(t, 0, emf["AnomalyCount"])
			require.EqualValues(t, 1, emf["PollErrors"])
			if mode == "EXCLUSIVE" {
				require.EqualValues(t, 2, emf["BacklogCount"])
				require.EqualValues(t, 0, emf["NeedsReviewCount"])
				require.Contains(t, emf, "OldestUnprocessedAgeSeconds")
			} else {
				for _, gauge := range []string{"BacklogCount", "NeedsReviewCount", "OldestUnprocessedAgeSeconds"} {
					require.NotContains(t, emf, gauge, "a gauge that could not be read is missing, not 0")
				}
			}
		})
	}
}

// TestNeedsReviewReceiptsLeaveTheClaimsRange: a receipt whose last attempt
// fails, and one that reached the limit before claims parked such rows (an
// old available_at at the front of the claim's index), both end up parked
// (available_at = 'infinity') by a run, still counted as needing review. The
// claim's plan with many of them is in internal/inbox's
// TestClaimDoesNotReadNeedsReviewRows.
func TestNeedsReviewReceiptsLeaveTheClaimsRange(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.receive(t, stripetest.Event("evt_bad", "invoice.paid", map[string]any{"object": "invoice"})) // no id
	b.receive(t, paid("evt_old", "in_old"))
	b.receive(t, paid("evt_ok", "in_ok"))
	_, err := b.pool.Exec(ctx, "UPDATE webhook_inbox SET attempts = 1, available_at = now() - interval '1 hour', last_error = 'boom' WHERE event_id = 'evt_old'")
	require.NoError(t, err)

	s := b.run(t, b.newWorker(t, nil, worker.Config{Concurrency: 1, MaxAttempts: 1}))
	require.Equal(t, 1, s.Processed)
	require.Equal(t, 1, s.Failed)
	require.Equal(t, 2, s.NeedsReview)
	require.Equal(t, 0, s.Remaining)
	require.Equal(t, 2, b.db.Count(t, "webhook_inbox", "processed_at IS NULL AND attempts = 1 AND available_at = 'infinity'"))
}
