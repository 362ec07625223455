package worker_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/stripetest"
	"github.com/stripe-inbox/inbox/internal/worker"
)

const batchSizeEnv = "INBOX_WORKER_BATCH_SIZE"

// testBatchSize is the batch size every test's worker uses: the default, or
// INBOX_WORKER_BATCH_SIZE when TestEveryTestAtBatchSizeOne re-runs the suite.
func testBatchSize(t *testing.T) int {
	t.Helper()
	v := os.Getenv(batchSizeEnv)
	if v == "" {
		return 0
	}
	n, err := strconv.Atoi(v)
	require.NoError(t, err)
	return n
}

// TestEveryTestAtBatchSizeOne runs this package's whole suite again in a
// child process with one receipt per transaction (the seed's design), so
// both processing paths pass every test.
func TestEveryTestAtBatchSizeOne(t *testing.T) {
	t.Parallel()
	if os.Getenv(batchSizeEnv) != "" {
		return // already the re-run
	}
	cmd := exec.Command(os.Args[0], "-test.run=^Test", "-test.skip=^TestEveryTestAtBatchSizeOne$", "-test.count=1")
	cmd.Env = append(os.Environ(), batchSizeEnv+"=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "the suite at batch size 1 failed:\n%s", out)
}

func TestFailingReceiptInTheMiddleOfABatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	reg := handlers.Default()
	real := reg["invoice.paid"]
	reg["invoice.paid"] = handlers.HandlerFunc(func(ctx context.Context, tx handlers.DB, ev handlers.Event) (handlers.Result, error) {
		res, err := real(ev)(ctx, tx) // the booking runs, then the receipt fails
		if err == nil && ev.ID == "evt_3" {
			return res, errors.New("boom")
		}
		return res, err
	})
	for i := 1; i <= 5; i++ {
		b.receive(t, paid(fmt.Sprintf("evt_%d", i), fmt.Sprintf("in_%d", i)))
	}
	w := b.newWorker(t, reg, worker.Config{Concurrency: 1, ClaimLimit: 5, BatchSize: 5})
	s := b.run(t, w)
	require.Equal(t, 4, s.Processed)
	require.Equal(t, 1, s.Failed)
	require.Equal(t, 4, b.db.Count(t, "ledger_entries", ""))
	require.Equal(t, 0, b.db.Count(t, "ledger_entries", "invoice_id = 'in_3'"), "the failed receipt's booking rolled back to its savepoint")
	require.Equal(t, 0, b.db.Count(t, "invoices", "id = 'in_3'"))
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "event_id = 'evt_3' AND processed_at IS NULL AND attempts = 1 AND last_error LIKE '%boom%'"))
	require.Equal(t, 4, b.db.Count(t, "webhook_inbox", "processed_at IS NOT NULL AND attempts = 1"))
}

func TestConcurrentBatchesOverTheSameInvoicesDoNotDeadlock(t *testing.T) {
	t.Parallel()
	// Receipts for two invoices, interleaved, so that claims in event-id
	// order would take the invoices in opposite orders. Batches are ordered
	// by business key, so they lock in_0 before in_1 and never deadlock.
	b := setup(t)
	for i := range 40 {
		b.receive(t, paid(fmt.Sprintf("evt_%02d", i), fmt.Sprintf("in_%d", (i/5+i)%2)))
	}
	w := b.newWorker(t, nil, worker.Config{Concurrency: 4, ClaimLimit: 5, BatchSize: 5})
	s := b.run(t, w)
	require.Equal(t, 40, s.Processed)
	require.Equal(t, 0, s.Failed)
	require.Equal(t, 2, b.db.Count(t, "ledger_entries", ""))
	require.Equal(t, 40, b.db.Count(t, "webhook_inbox", "processed_at IS NOT NULL AND attempts = 1"))
}

func TestProcessKilledInTheMiddleOfABatchCommitsNothingAndLosesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := 1; i <= 5; i++ {
		b.receive(t, paid(fmt.Sprintf("evt_b%d", i), fmt.Sprintf("in_b%d", i)))
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	// A real worker with batches of 5 applies evt_b1 and evt_b2 in the batch's
	// transaction, then hangs while applying evt_b3; it is killed there.
	cmd.Env = append(os.Environ(), crashChildEnv+"="+b.db.URL, crashChildBatchEnv+"=5", crashChildHangOnEnv+"=evt_b3")
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "APPLIED evt_b3 <nil>", strings.TrimSpace(line))

	require.NoError(t, cmd.Process.Kill())
	require.Error(t, cmd.Wait())
	waitForNoOpenTransaction(t, b)

	// evt_b1 and evt_b2 were applied in the same transaction: nothing committed.
	require.Equal(t, 0, b.db.Count(t, "ledger_entries", ""))
	require.Equal(t, 5, b.db.Count(t, "webhook_inbox", "processed_at IS NULL AND attempts = 1"))

	w := b.newWorker(t, nil, worker.Config{Concurrency: 2})
	w.Now = at(time.Now().UTC().Add(2 * time.Minute)) // after the lease
	s := b.run(t, w)
	require.Equal(t, 5, s.Processed)
	require.Equal(t, 5, b.db.Count(t, "ledger_entries", ""))
	require.Equal(t, 5, b.db.Count(t, "webhook_inbox", "processed_at IS NOT NULL AND attempts = 2"))
}

func TestBatchWithAReceiptHeldElsewhereProcessesTheOthers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := 1; i <= 3; i++ {
		b.receive(t, paid(fmt.Sprintf("evt_h%d", i), fmt.Sprintf("in_h%d", i)))
	}
	ctx := context.Background()
	claimed, err := inbox.Claim(ctx, b.pool, inbox.ClaimParams{MaxAttempts: 10, Limit: 3, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, claimed, 3)
	// A worker that took evt_h2 over after its lease holds the row.
	holder := b.db.Connect(t)
	tx, err := holder.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "SELECT 1 FROM webhook_inbox WHERE event_id = 'evt_h2' FOR UPDATE")
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })

	w := b.newWorker(t, nil, worker.Config{Concurrency: 1, ClaimLimit: 3, BatchSize: 3,
		StatementTimeout: 300 * time.Millisecond, DeadlineMargin: time.Second, Lease: 3 * time.Second})
	outcomes, _ := w.ProcessBatch(ctx, b.db.Connect(t), claimed)
	want := map[string]worker.Outcome{"evt_h1": worker.Applied, "evt_h2": worker.Failed, "evt_h3": worker.Applied}
	for i, c := range claimed {
		require.Equal(t, want[c.EventID], outcomes[i], "%s: %v", c.EventID, outcomes)
	}
	require.Equal(t, 2, b.db.Count(t, "ledger_entries", ""))
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "event_id = 'evt_h2' AND processed_at IS NULL"))
}

func TestReceiptFailingBeforeAnyStatementDoesNotUndoTheOneBeforeIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Batches run in object-id order: in_a (applied), then in_b, whose
	// payload fails to parse before the handler sends anything.
	b.receive(t, paid("evt_a", "in_a"))
	b.receive(t, stripetest.Event("evt_b", "invoice.paid", map[string]any{"id": "in_b", "object": "invoice", "amount_paid": "not a number"}))
	b.receive(t, paid("evt_c", "in_c"))
	w := b.newWorker(t, nil, worker.Config{Concurrency: 1, ClaimLimit: 3, BatchSize: 3})
	s := b.run(t, w)
	require.Equal(t, 2, s.Processed)
	require.Equal(t, 1, s.Failed)
	require.Equal(t, 1, b.db.Count(t, "ledger_entries", "invoice_id = 'in_a'"), "the receipt before the failure keeps its effect")
	require.Equal(t, 1, b.db.Count(t, "ledger_entries", "invoice_id = 'in_c'"))
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "event_id = 'evt_b' AND processed_at IS NULL AND last_error LIKE 'bad_payload:%'"))
}

// waveRegistry adds test handlers to the default ones:
//   - test.note writes one outbox row per run (no unique key, so a second
//     run that was not rolled back would show as a second row);
//   - test.multi runs three statements and checks, between them, that no
//     statement of a later receipt is in effect;
//   - test.late_failure runs one statement, then one that violates a
//     constraint;
//   - test.early_failure's first statement violates a constraint;
//   - test.rows reads rows with Query, then writes a note.
func waveRegistry(t *testing.T) handlers.Registry {
	reg := handlers.Default()
	note := func(ctx context.Context, tx handlers.DB, id string) error {
		_, err := tx.Exec(ctx, "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('Test', $1, 'note', '{}')", id)
		return err
	}
	reg["test.note"] = handlers.HandlerFunc(func(ctx context.Context, tx handlers.DB, ev handlers.Event) (handlers.Result, error) {
		return handlers.Result{Outcome: handlers.Applied}, note(ctx, tx, ev.ID)
	})
	reg["test.multi"] = handlers.HandlerFunc(func(ctx context.Context, tx handlers.DB, ev handlers.Event) (handlers.Result, error) {
		if _, err := tx.Exec(ctx, "INSERT INTO ledger_entries (invoice_id, kind, amount, event_id) VALUES ($1, 'a', 1, $1)", ev.ID); err != nil {
			return handlers.Result{}, err
		}
		var mine, later int
		err := tx.QueryRow(ctx, "SELECT count(*) FILTER (WHERE invoice_id = $1), (SELECT count(*) FROM outbox WHERE aggregate_id > $1) FROM ledger_entries", ev.ID).Scan(&mine, &later)
		if err != nil {
			return handlers.Result{}, err
		}
		if mine != 1 || later != 0 {
			return handlers.Result{}, fmt.Errorf("between its statements: %d of its own entries, %d notes of later receipts", mine, later)
		}
		_, err = tx.Exec(ctx, "INSERT INTO ledger_entries (invoice_id, kind, amount, event_id) VALUES ($1, 'b', 1, $1)", ev.ID)
		return handlers.Result{Outcome: handlers.Applied}, err
	})
	reg["test.late_failure"] = handlers.HandlerFunc(func(ctx context.Context, tx handlers.DB, ev handlers.Event) (handlers.Result, error) {
		if err := note(ctx, tx, ev.ID); err != nil {
			return handlers.Result{}, err
		}
		_, err := tx.Exec(ctx, "INSERT INTO invoices (id, status) VALUES ($1, 'paid')", ev.ID) // customer_id is NOT NULL
		return handlers.Result{Outcome: handlers.Applied}, err
	})
	reg["test.early_failure"] = handlers.HandlerFunc(func(ctx context.Context, tx handlers.DB, ev handlers.Event) (handlers.Result, error) {
		_, err := tx.Exec(ctx, "INSERT INTO invoices (id, status) VALUES ($1, 'paid')", ev.ID)
		return handlers.Result{Outcome: handlers.Applied}, err
	})
	reg["test.rows"] = handlers.HandlerFunc(func(ctx context.Context, tx handlers.DB, ev handlers.Event) (handlers.Result, error) {
		rows, err := tx.Query(ctx, "SELECT aggregate_id FROM outbox WHERE aggregate_id < $1 ORDER BY 1", ev.ID)
		if err != nil {
			return handlers.Result{}, err
		}
		var before []string
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				return handlers.Result{}, err
			}
			before = append(before, id)
		}
		if err := rows.Err(); err != nil {
			return handlers.Result{}, err
		}
		if len(before) != 1 {
			return handlers.Result{}, fmt.Errorf("notes before it: %v", before)
		}
		return handlers.Result{Outcome: handlers.Applied}, note(ctx, tx, ev.ID)
	})
	return reg
}

// TestWavesKeepEachReceiptsStatementsTogether puts each kind of handler
// between ordinary receipts in one batch. Batches send the first statement
// of many receipts in one round trip; a handler that needs more statements,
// or fails, must see none of the later receipts' work, and every later
// receipt must take effect exactly once.
func TestWavesKeepEachReceiptsStatementsTogether(t *testing.T) {
	for _, middle := range []string{"test.multi", "test.late_failure", "test.early_failure", "test.rows"} {
		t.Run(middle, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			// Batches run in object-id order, which here is event-id order.
			b.receive(t, stripetest.Event("e1", "test.note", map[string]any{"id": "e1"}))
			b.receive(t, stripetest.Event("e2", middle, map[string]any{"id": "e2"}))
			for _, id := range []string{"e3", "e4", "e5"} {
				b.receive(t, stripetest.Event(id, "test.note", map[string]any{"id": id}))
			}
			w := b.newWorker(t, waveRegistry(t), worker.Config{Concurrency: 1, ClaimLimit: 5, BatchSize: 5})
			s := b.run(t, w)

			for _, id := range []string{"e1", "e3", "e4", "e5"} {
				require.Equal(t, 1, b.db.Count(t, "outbox", "aggregate_id = '"+id+"'"), id)
			}
			switch middle {
			case "test.multi":
				require.Equal(t, 5, s.Processed)
				require.Equal(t, 2, b.db.Count(t, "ledger_entries", "invoice_id = 'e2'"))
			case "test.rows":
				require.Equal(t, 5, s.Processed)
				require.Equal(t, 1, b.db.Count(t, "outbox", "aggregate_id = 'e2'"))
			default:
				require.Equal(t, 4, s.Processed)
				require.Equal(t, 1, s.Failed)
				require.Equal(t, 0, b.db.Count(t, "outbox", "aggregate_id = 'e2'"), "the failed receipt's first statement rolled back")
				require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "event_id = 'e2' AND processed_at IS NULL AND last_error LIKE 'pg 23502:%'"))
			}
			require.Equal(t, s.Processed, b.db.Count(t, "webhook_inbox", "processed_at IS NOT NULL"))
		})
	}
}

// TestDeadlockedReceiptIsRetriedOnce makes a receipt of a batch deadlock
// with another transaction: the receipt's handler locks invoice X then Y,
// the other transaction holds Y and then asks for X. PostgreSQL aborts the
// handler's statement (the other transaction waits longer before it checks
// for deadlocks); the receipt is rolled back to its savepoint, which lets
// the other transaction go on, and is applied again on its own once the
// batch has committed. No attempt is used up.
func TestDeadlockedReceiptIsRetriedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, "INSERT INTO invoices (id, customer_id, status) VALUES ('in_x', 'cus_1', 'open'), ('in_y', 'cus_1', 'open')")
	require.NoError(t, err)

	other := b.db.Connect(t)
	tx, err := other.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	_, err = tx.Exec(ctx, "SET LOCAL deadlock_timeout = '60s'")
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "SELECT 1 FROM invoices WHERE id = 'in_y' FOR UPDATE")
	require.NoError(t, err)

	var runs atomic.Int32
	holdsX := make(chan struct{})
	reg := waveRegistry(t)
	reg["test.deadlock"] = handlers.HandlerFunc(func(ctx context.Context, db handlers.DB, ev handlers.Event) (handlers.Result, error) {
		if _, err := db.Exec(ctx, "SELECT 1 FROM invoices WHERE id = 'in_x' FOR UPDATE"); err != nil {
			return handlers.Result{}, err
		}
		if runs.Add(1) == 1 {
			close(holdsX)
			// Ask for Y only once the other transaction waits for X, so the
			// cycle exists when PostgreSQL checks for it (once, after
			// deadlock_timeout).
			for waiting := false; !waiting; time.Sleep(10 * time.Millisecond) {
				if err := b.pool.QueryRow(ctx, "SELECT count(*) > 0 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'").Scan(&waiting); err != nil {
					return handlers.Result{}, err
				}
			}
		}
		_, err := db.Exec(ctx, "SELECT 1 FROM invoices WHERE id = 'in_y' FOR UPDATE")
		return handlers.Result{Outcome: handlers.Applied}, err
	})
	otherDone := make(chan error, 1)
	go func() {
		<-holdsX
		_, err := tx.Exec(ctx, "SELECT 1 FROM invoices WHERE id = 'in_x' FOR UPDATE") // waits: deadlock
		if err == nil {
			err = tx.Commit(ctx)
		}
		otherDone <- err
	}()

	b.receive(t, stripetest.Event("e1", "test.note", map[string]any{"id": "e1"}))
	b.receive(t, stripetest.Event("e2", "test.deadlock", map[string]any{"id": "e2"}))
	b.receive(t, stripetest.Event("e3", "test.note", map[string]any{"id": "e3"}))
	w := b.newWorker(t, reg, worker.Config{Concurrency: 1, ClaimLimit: 3, BatchSize: 3, StatementTimeout: 10 * time.Second, DeadlineMargin: 20 * time.Second})
	s := b.run(t, w)
	require.NoError(t, <-otherDone, "the other transaction got its lock once the receipt rolled back")
	require.Equal(t, int32(2), runs.Load(), "the deadlocked receipt ran twice")
	require.Equal(t, 3, s.Processed)
	require.Equal(t, 0, s.Failed)
	require.Equal(t, 3, b.db.Count(t, "webhook_inbox", "processed_at IS NOT NULL AND attempts = 1 AND last_error IS NULL"))
	require.Equal(t, 2, b.db.Count(t, "outbox", "aggregate_id IN ('e1', 'e3')"))
}

// TestBatchWhereEveryHandlerNeedsSeveralStatements: every receipt cuts its
// wave; each still takes effect once, with its statements together.
func TestBatchWhereEveryHandlerNeedsSeveralStatements(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 9 {
		id := fmt.Sprintf("m%d", i)
		b.receive(t, stripetest.Event(id, "test.multi", map[string]any{"id": id}))
	}
	w := b.newWorker(t, waveRegistry(t), worker.Config{Concurrency: 1, ClaimLimit: 9, BatchSize: 9})
	s := b.run(t, w)
	require.Equal(t, 9, s.Processed)
	require.Equal(t, 18, b.db.Count(t, "ledger_entries", ""))
	require.Equal(t, 9, b.db.Count(t, "webhook_inbox", "processed_at IS NOT NULL AND attempts = 1"))
}

// TestUnplacedRefundThatWaitsTooLongIsAppliedOnItsOwn: the refunds the
// claim could not place (no invoice linked to their charge yet) go in one
// transaction after the batch, where no lock is waited for long; one whose
// charge's link another transaction holds gives up after the lock timeout,
// the others of that transaction commit, and it is applied on its own
// (waiting as long as it takes) once that transaction has committed. Each
// refund is booked once.
func TestUnplacedRefundThatWaitsTooLongIsAppliedOnItsOwn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, "INSERT INTO payment_links (payment_id, has_refunds) VALUES ('ch_held', true)")
	require.NoError(t, err)
	other := b.db.Connect(t)
	tx, err := other.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	_, err = tx.Exec(ctx, "SELECT 1 FROM payment_links WHERE payment_id = 'ch_held' FOR UPDATE")
	require.NoError(t, err)

	b.receive(t, paid("evt_paid", "in_1"))
	b.receive(t, stripetest.Event("evt_re_held", "refund.created", stripetest.Refund("re_held", "ch_held", 300)))
	b.receive(t, stripetest.Event("evt_re_a", "refund.created", stripetest.Refund("re_a", "ch_a", 200)))
	b.receive(t, stripetest.Event("evt_re_b", "refund.created", stripetest.Refund("re_b", "ch_b", 100)))
	w := b.newWorker(t, nil, worker.Config{Concurrency: 1, ClaimLimit: 4, BatchSize: 4, StatementTimeout: 10 * time.Second, DeadlineMargin: 20 * time.Second})
	done := make(chan worker.Summary, 1)
	go func() { done <- b.run(t, w) }()

	b.db.WaitUntil(t, "every receipt but the held refund is processed",
		"SELECT count(*) = 3 FROM webhook_inbox WHERE processed_at IS NOT NULL AND event_id <> 'evt_re_held'")
	b.db.WaitForLockWaiter(t) // the held refund, on its own now
	require.Equal(t, 0, b.db.Count(t, "webhook_inbox", "processed_at IS NOT NULL AND event_id = 'evt_re_held'"))
	require.NoError(t, tx.Commit(ctx))
	s := <-done
	require.Equal(t, 4, s.Processed)
	require.Equal(t, 0, s.Failed)
	require.Equal(t, 1, s.LockWaits, "the held refund gave up once in the batch")
	require.Equal(t, 4, b.db.Count(t, "webhook_inbox", "processed_at IS NOT NULL AND attempts = 1 AND last_error IS NULL"))
	for _, re := range []string{"re_held", "re_a", "re_b"} {
		require.Equal(t, 1, b.db.Count(t, "ledger_entries", "kind = $1", "refund:"+re), re)
	}
}
