package worker

// This file is one receipt's transaction, read top to bottom in the order a
// claimed batch meets it (drain, in worker.go, hands it over):
// processBatch orders the batch and splits off the refunds it cannot place
// (applied after it, in a transaction of their own with bounded lock
// waits, unplacedLockWait);
// batchTx opens its transaction and locks the receipts in one round trip
// (inbox.BeginLockMany), re-checks them, filters the other mode (books),
// reads the receipts and runs their bookings (read, book), records
// failures (isDeadlock, isLockTimeout, describe, backoff), and marks the
// rest processed and commits in one more (lockedOnce,
// inbox.MarkManyProcessedCommit, inPipelinedTx); oneByOne is the
// fallback when that transaction fails, and giveBack releases the receipts
// the deadline margin leaves unstarted; process is the one-receipt
// transaction (apply: lock, re-check, mode filter, handler, mark) that
// BATCH_SIZE=1, the fallback, a deadlocked receipt and a refund that gave
// up a lock wait use. The deadline margin, inTx, inPipelinedTx and the
// connection the transactions run on close the file.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stripe-inbox/inbox/internal/batch"
	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/inbox"
)

// Outcome of processing one claimed receipt.
type Outcome string

const (
	Applied     Outcome = "applied"      // the handler's effect committed with processed_at
	Ignored     Outcome = "ignored"      // no handler; marked processed
	AlreadyDone Outcome = "already_done" // another worker completed it first
	Failed      Outcome = "failed"       // rolled back; failure recorded and rescheduled
	// IgnoredOtherMode: the event's livemode is not the mode this worker
	// books (Config.Mode); marked processed without running its handler.
	IgnoredOtherMode Outcome = Outcome(handlers.IgnoredOtherMode)
	// Released: claimed, then given back unprocessed (attempt uncounted)
	// because the invocation reached its deadline margin first.
	Released Outcome = "released"
)

// processBatch applies several claimed receipts in one transaction, each
// undone alone when it fails (internal/batch: its own savepoint, or a
// restart), so that they share one commit (one WAL flush) instead of paying
// one each. Per receipt the rules are those of process: lock the row
// (waiting), re-check it is unprocessed, apply the handler, mark it
// processed. A receipt whose handler fails has its statements rolled back
// and its failure is recorded (last_error, backoff) in the same transaction;
// the others commit together. A crash before the commit loses nothing: the
// attempts were counted by the claim, and every receipt of the batch comes
// back after its lease.
//
// Receipts are processed in the order of the invoice they belong to
// (Claimed.LockKey), then invoice events before payment and refund events,
// then event id, so that concurrent batches take the rows they share in the
// same order: an invoice's row, then its payments' links, then refunds and
// the ledger (see lockOrder and splitUnplaced).
// A transaction is closed early (committed) once it has run for
// StatementTimeout, so one slow receipt cannot hold the rest of the batch's
// locks for long. A deadlock between batches that touch the same objects in
// another order (PostgreSQL aborts one statement) rolls back only that
// receipt, which is tried again on its own (as process does) once the batch
// has committed and released its locks.
//
// It returns one outcome per receipt, in the order given, and whether each
// raised an anomaly. A batch whose first transaction was closed early goes
// on in another one only while ctx's deadline margin (Config.DeadlineMargin)
// has not come (the caller checks it before the first): from then on, the
// receipts not started are given back, Released (see giveBack), as are
// those of a failed batch that the fallback did not start (see oneByOne). A
// receipt that could not be given back (the release failed, or another
// worker has claimed it since) has no outcome (""): it keeps its counted
// attempt and comes back after its lease.
func (w *Worker) processBatch(ctx context.Context, conns connSource, claimed []inbox.Claimed) ([]Outcome, []bool) {
	order := make([]int, len(claimed))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return lockOrder(claimed[a], claimed[b]) })
	outcomes := make([]Outcome, len(claimed))
	anomalies := make([]bool, len(claimed))
	order, alone := splitUnplaced(claimed, order)
	stopAt := w.stopAt(ctx)
	for first := true; len(order) > 0; first = false {
		// As the drainer checks before each batch: a transaction started
		// past the margin could run into the end of the invocation.
		if !first && (expired(stopAt) || ctx.Err() != nil) {
			w.giveBack(ctx, conns, claimed, append(order, alone...), outcomes, anomalies, nil)
			return outcomes, anomalies
		}
		order = w.batchTx(ctx, conns, claimed, order, outcomes, anomalies, 0)
	}
	for len(alone) > 0 {
		if expired(stopAt) || ctx.Err() != nil {
			w.giveBack(ctx, conns, claimed, alone, outcomes, anomalies, nil)
			break
		}
		alone = w.batchTx(ctx, conns, claimed, alone, outcomes, anomalies, unplacedLockWait)
	}
	return outcomes, anomalies
}

// lockOrder orders a batch: by the invoice each receipt belongs to; within
// one invoice, invoice events (they take the invoice's row first, then its
// payments' links) before the others (payments and refunds take a link
// first, never the invoice's row after it); then by event id. Every batch
// so takes an invoice's row, then links, then refunds and ledger rows, and
// invoices in one order: no two batches can wait for each other. The
// exception is a statement a batch sends after those of later invoices
// (their statements interleave: interleaveKey); it waits for a lock at
// most interleavedLockWait.
func lockOrder(a, b inbox.Claimed) int {
	return cmp.Or(cmp.Compare(a.LockKey, b.LockKey),
		cmp.Compare(invoiceRank(a.EventType), invoiceRank(b.EventType)),
		cmp.Compare(a.EventID, b.EventID))
}

func invoiceRank(eventType string) int {
	if strings.HasPrefix(eventType, "invoice.") {
		return 0
	}
	return 1
}

// interleaveKey is c's key for internal/batch (Classes.Keys): its invoice
// when the claim placed it on one (LockKey), else none. The handlers of
// receipts of different invoices touch different rows (the invoice's row,
// its payments' links, their refunds and disputes, the ledger entries and
// anomalies of the invoice; outbox rows are only inserted), so the
// statements of one may run between those of the other, in one
// transaction, without either seeing the other half done; receipts of
// one invoice run one after the other, in lockOrder. A receipt the claim
// could not place (a charge's or its own id) interleaves with none.
//
// Interleaved, a batch may hold an invoice's rows while a statement of an
// invoice before it in lockOrder waits for a lock: out of the order that
// keeps batches from waiting for each other. Such a statement waits at most
// interleavedLockWait; then it fails (lock_not_available), its receipt is
// rolled back with a restart (internal/batch) and applied again on its own
// after the batch commits, as a refund that gave up a lock wait is.
func interleaveKey(c inbox.Claimed) string {
	if strings.HasPrefix(c.LockKey, "in_") {
		return c.LockKey
	}
	return ""
}

// refundEvents are the types whose handlers take a charge's or
// PaymentIntent's payment_links row (internal/handlers: chargeRefunded,
// refundChanged, disputeChanged) before they know the invoice it belongs to.
var refundEvents = map[string]bool{
	"charge.refunded": true, "refund.created": true, "refund.updated": true,
	"refund.failed": true, "charge.refund.updated": true,
	// Disputes take their charge's link the same way (disputeChanged).
	"charge.dispute.created": true, "charge.dispute.updated": true, "charge.dispute.closed": true,
	"charge.dispute.funds_withdrawn": true, "charge.dispute.funds_reinstated": true,
}

// splitUnplaced takes out of order the refund events whose invoice the
// claim could not tell (their LockKey is not an invoice: payment_links did
// not link their charge yet), to be processed after the batch, in a
// transaction of their own where no lock is waited for longer than
// unplacedLockWait. In the batch they would take their charge's rows at a
// place in the batch's order that does not follow the invoice they belong
// to, and a batch holding them while it waits for another invoice's rows,
// held by a batch that waits for that charge's (its invoice.paid links
// it), is a deadlock that PostgreSQL breaks only after deadlock_timeout
// (1 s), again and again during a backlog (README, Known problems). Every
// other receipt keeps its place in the invoice order.
func splitUnplaced(claimed []inbox.Claimed, order []int) (batched, alone []int) {
	for _, i := range order {
		c := claimed[i]
		if refundEvents[c.EventType] && !strings.HasPrefix(c.LockKey, "in_") {
			alone = append(alone, i)
		} else {
			batched = append(batched, i)
		}
	}
	return batched, alone
}

// unplacedLockWait bounds each lock wait of the transaction that applies
// the refunds the claim could not place (splitUnplaced): lock_timeout. Such
// a transaction holds its refunds' charges' rows in an order no other
// batch follows, so it may wait for a batch that waits for it; then its
// statement fails after this wait instead of after deadlock_timeout (1 s),
// only that refund is rolled back (to its savepoint), and it is applied
// again on its own once the transaction has committed, as a deadlock's
// victim is. Alone, a refund holds nothing while it waits for its charge's
// row, so it cannot close a cycle; in one transaction together (one commit
// instead of one each), the refunds of a backlog whose invoices' payments
// are not linked yet cost a fraction of what they cost one transaction
// each (issue 24). A wait that is not a cycle is a batch of another
// drainer holding the row: tens of milliseconds.
const unplacedLockWait = 100 * time.Millisecond

// interleavedLockWait bounds each lock wait of a statement that a batch
// sends after statements of receipts of later invoices (see interleaveKey):
// batch.Classes.LockWait.
const interleavedLockWait = unplacedLockWait

// batchTx processes claimed[order[0]], claimed[order[1]], ... in one
// transaction until they are all done or the time budget is spent, commits,
// and returns the receipts it did not start (to go in another transaction).
// With a positive lockWait no lock is waited for longer (lock_timeout): a
// receipt whose statement waited that long is rolled back and applied
// again on its own after the commit (see unplacedLockWait).
//
// Round trips: BEGIN, the timeouts and one statement that locks every
// receipt of the batch go in one pipeline (inPipelinedTx, inbox.BeginLockMany;
// a receipt another worker completed is AlreadyDone; one of the other mode is marked
// IgnoredOtherMode without its handler); each receipt's event is read
// (handlers.Handler: decoded, its version and contract checked) and
// internal/batch runs the bookings,
// each undone alone when it fails (under a savepoint of its own, or shared
// by steady event types, with a restart when one surprises), sending the
// first statement of many in one round trip (see its package comment);
// failures are recorded (a failed handler's statements were rolled back);
// one statement marks the applied receipts processed; and the commit. No handler is started
// once the transaction has run for StatementTimeout, so one slow receipt
// cannot hold the rest of the batch's locks for long.
//
// A handler that deadlocked was rolled back to its savepoint (or to the
// one before it, with a restart), which released its locks, so the other transaction can go on; it still waits
// for this batch's other locks, so the receipt is tried again on its own
// (process) once this batch has committed, without using up an attempt.
//
// When the transaction itself fails (a statement that fails before it runs,
// at prepare or while its arguments are encoded; a handler that swallowed a
// statement's error, so the transaction is aborted; a lost connection),
// nothing of it committed, and the receipts it took are processed again one
// transaction each, so that only the receipt that caused it records a
// failure. Otherwise the whole batch would come back together after its
// lease (one claim gives its rows one available_at) and fail together, until
// every receipt of it needed review.
func (w *Worker) batchTx(ctx context.Context, conns connSource, claimed []inbox.Claimed, order []int, outcomes []Outcome, anomalies []bool, lockWait time.Duration) []int {
	start := time.Now()
	conn, err := conns(ctx)
	if err != nil {
		w.oneByOne(ctx, conns, claimed, order, outcomes, anomalies, err)
		return nil
	}
	var (
		rest      []int // not started: for the next transaction
		ran       bool  // batch.Run was called (rest is known)
		alone     []int // deadlocked: retried on their own after the commit
		failures  []failure
		latencies []time.Duration
	)
	keys := make([]inbox.Key, len(order))
	for j, i := range order {
		keys[j] = claimed[i].Key
	}
	err = inPipelinedTx(ctx, conn, func(tx txConn) (bool, error) {
		// BEGIN, the timeouts and the lock in one round trip.
		locked, err := inbox.BeginLockMany(ctx, tx, keys, w.cfg.StatementTimeout, lockWait)
		if err != nil {
			return false, err
		}
		var (
			done         []inbox.Key // to be marked processed
			doneOutcomes []string
			jobs         []batch.Job
			jobClasses   []string // each job's event type: batch learns which take several statements
			jobKeys      []string // each job's invoice: the statements of jobs of different invoices may interleave
			jobReceipt   []int    // the receipt (index in claimed) of each job
			results      = make([]handlers.Result, len(order))
		)
		for _, i := range order {
			c := claimed[i]
			l, ok := locked[c.Key]
			switch {
			case !ok:
				outcomes[i] = AlreadyDone // another worker completed it
			case !w.books(l):
				outcomes[i] = IgnoredOtherMode
				done, doneOutcomes = append(done, c.Key), append(doneOutcomes, string(IgnoredOtherMode))
			default:
				// Read here, not in the job: batch runs each job on a
				// goroutine of its own, whose small stack the decode
				// would grow. A receipt the time budget then leaves for
				// the next transaction (rest) is read again there: a
				// few µs, against a budget of STATEMENT_TIMEOUT.
				k, booking := len(jobs), read(w.handlers, event(c, l))
				jobs = append(jobs, func(ctx context.Context, db batch.DB) (err error) {
					results[k], err = book(ctx, booking, db)
					return err
				})
				jobReceipt, jobClasses = append(jobReceipt, i), append(jobClasses, c.EventType)
				jobKeys = append(jobKeys, interleaveKey(c))
			}
		}
		n, errs, err := batch.RunClasses(ctx, tx, jobs, batch.Classes{Of: jobClasses, Keys: jobKeys, Shapes: &w.shapes, LockWait: interleavedLockWait},
			func() bool { return time.Since(start) < w.cfg.StatementTimeout })
		rest, ran = jobReceipt[n:], true
		if err != nil {
			return false, err
		}
		for k, i := range jobReceipt[:n] {
			c := claimed[i]
			switch {
			case errs[k] == nil:
				outcomes[i], anomalies[i] = Outcome(results[k].Outcome), results[k].Anomaly
				done, doneOutcomes = append(done, c.Key), append(doneOutcomes, string(results[k].Outcome))
			case isDeadlock(errs[k]):
				w.deadlocks.Add(1)
				alone = append(alone, i)
			case isLockTimeout(errs[k]): // lockWait, or interleavedLockWait
				w.lockWaits.Add(1)
				alone = append(alone, i)
			default:
				text, delay := describe(errs[k]), w.backoff(c.Attempts)
				if err := inbox.RecordFailure(ctx, tx, c.Key, text, delay, w.Now(), w.cfg.MaxAttempts); err != nil {
					return false, err
				}
				outcomes[i] = Failed
				failures = append(failures, failure{i, text, delay})
			}
		}
		// The mark and COMMIT in one round trip: the mark matches every
		// key, each locked unprocessed above and none twice.
		if err := lockedOnce(done, locked); err != nil {
			return false, err
		}
		var committed bool
		latencies, committed, err = inbox.MarkManyProcessedCommit(ctx, tx, done, doneOutcomes, w.Now())
		return committed, err
	})
	taken := order
	if ran {
		taken = slices.DeleteFunc(slices.Clone(order), func(i int) bool { return slices.Contains(rest, i) })
	}
	if err != nil {
		// Nothing of this transaction committed: forget what it settled,
		// and fall back to one transaction per receipt for those it took
		// (all of them when locking the batch failed, say because a receipt
		// is held past the statement timeout by a worker that took it over
		// after its lease), so only the receipt that caused the failure
		// fails.
		for _, i := range order {
			outcomes[i], anomalies[i] = "", false
		}
		w.oneByOne(ctx, conns, claimed, taken, outcomes, anomalies, err)
		return rest
	}
	w.recordLatency(latencies...)
	for _, f := range failures {
		c := claimed[f.i]
		level := slog.LevelWarn
		if c.Attempts >= w.cfg.MaxAttempts {
			level = slog.LevelError
		}
		w.logger.Log(ctx, level, "receipt failed", "endpoint", c.Endpoint, "event_id", c.EventID, "event_type", c.EventType,
			"attempt", c.Attempts, "outcome", Failed, "error", f.err, "retry_in_ms", f.delay.Milliseconds(),
			"needs_review", c.Attempts >= w.cfg.MaxAttempts)
	}
	for _, i := range taken {
		if outcomes[i] != Failed && !slices.Contains(alone, i) {
			c := claimed[i]
			w.logger.InfoContext(ctx, "receipt", "endpoint", c.Endpoint, "event_id", c.EventID, "event_type", c.EventType,
				"attempt", c.Attempts, "outcome", outcomes[i], "anomaly", anomalies[i], "batch", len(taken))
		}
	}
	for _, i := range alone {
		outcomes[i], anomalies[i] = w.process(ctx, conns, claimed[i])
	}
	return rest
}

// failure is a receipt whose handler failed in a batch, recorded in it.
type failure struct {
	i     int // index in the claimed receipts
	err   string
	delay time.Duration
}

// books reports whether the receipt is of the Stripe mode this worker books.
// A receipt of the other mode is marked processed as ignored_other_mode and
// never reaches a handler, so it cannot touch invoices, the ledger or the
// outbox.
func (w *Worker) books(l inbox.Locked) bool {
	return l.Livemode == (w.cfg.Mode == ModeLive)
}

// event is what a handler sees of a locked receipt.
func event(c inbox.Claimed, l inbox.Locked) handlers.Event {
	return handlers.Event{ID: c.EventID, Type: l.EventType, Endpoint: c.Endpoint, Payload: l.Payload, Livemode: l.Livemode, Account: l.Account}
}

// read reads ev with its handler (decoding, version, contract), and book
// runs the Booking it returns. A panic in either fails only this receipt,
// with a *panicError (read returns a Booking that returns it): re-raised,
// it would end the process (the drainer goroutines are not the Lambda
// runtime's, which does not recover them) and lose every drainer's work in
// flight.
func read(reg handlers.Registry, ev handlers.Event) (b handlers.Booking) {
	defer func() {
		if p := recover(); p != nil {
			b = handlers.Failed(&panicError{value: p, stack: debug.Stack()})
		}
	}()
	return reg.Read(ev)
}

func book(ctx context.Context, b handlers.Booking, db handlers.DB) (res handlers.Result, err error) {
	defer func() {
		if p := recover(); p != nil {
			res, err = handlers.Result{}, &panicError{value: p, stack: debug.Stack()}
		}
	}()
	return b(ctx, db)
}

// panicError is a handler's panic: its value and the stack where it
// happened.
type panicError struct {
	value any
	stack []byte
}

func (e *panicError) Error() string {
	// From the frame that panicked: the frames above it (debug.Stack, the
	// deferred function, panic itself) say nothing about the cause.
	stack := string(e.stack)
	if i := strings.Index(stack, "\npanic("); i >= 0 {
		rest := stack[i+1:]
		for range 2 { // the panic( line and its file:line
			if j := strings.IndexByte(rest, '\n'); j >= 0 {
				rest = rest[j+1:]
			}
		}
		stack = rest
	}
	return fmt.Sprintf("%v\n%s", e.value, stack)
}

// isDeadlock reports whether err is PostgreSQL's deadlock_detected
// (SQLSTATE 40P01): the statement was chosen as a deadlock's victim.
func isDeadlock(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "40P01"
}

// isLockTimeout reports whether err is PostgreSQL's lock_not_available
// (SQLSTATE 55P03): the statement waited for a lock longer than its
// lock_timeout (batchTx's lockWait, or interleavedLockWait).
func isLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// backoff is the delay before attempt+1: min(cap, base*2^(attempt-1)),
// scaled by a random 50-100% so failed receipts do not retry in lockstep.
func (w *Worker) backoff(attempt int) time.Duration {
	exp := math.Pow(2, float64(max(attempt-1, 0)))
	d := time.Duration(math.Min(float64(w.cfg.BackoffCap), float64(w.cfg.BackoffBase)*exp))
	return time.Duration(float64(d) * (0.5 + w.Jitter()/2))
}

// describe turns an error into last_error: its class and a truncated message.
func describe(err error) string {
	class := "error"
	max := 500
	var pgErr *pgconn.PgError
	var panicErr *panicError
	switch {
	case errors.As(err, &panicErr):
		class, max = "panic", 2000 // room for the top of the stack
	case errors.As(err, &pgErr):
		class = "pg " + pgErr.Code
	case errors.Is(err, handlers.ErrBadPayload):
		class = "bad_payload"
	case errors.Is(err, handlers.ErrUnknownAPIVersion):
		class = "api_version"
	case errors.Is(err, context.DeadlineExceeded):
		class = "deadline"
	case errors.Is(err, context.Canceled):
		class = "canceled"
	}
	msg := err.Error()
	if len(msg) > max {
		msg = strings.ToValidUTF8(msg[:max], "") + "…" // not a rune cut in two: last_error is text
	}
	return class + ": " + msg
}

// oneByOne processes claimed[order[0]], claimed[order[1]], ... one transaction
// each, after the batch transaction failed with err. Before each receipt it checks, as the drainer does before each
// batch, that the invocation's deadline margin is not reached (and ctx is not
// done): from then on it gives the receipts it has not started back
// (inbox.Release, fenced: one another worker has claimed since is not ours),
// with their attempt uncounted, to be claimed again at once. Processing them
// past the margin could run into the end of the invocation and record
// deadline or canceled failures on receipts that did nothing wrong.
func (w *Worker) oneByOne(ctx context.Context, conns connSource, claimed []inbox.Claimed, order []int, outcomes []Outcome, anomalies []bool, err error) {
	stopAt := w.stopAt(ctx)
	logged := false
	for k, i := range order {
		if expired(stopAt) || ctx.Err() != nil {
			w.giveBack(ctx, conns, claimed, order[k:], outcomes, anomalies, err)
			break
		}
		if !logged {
			w.logger.WarnContext(ctx, "batch transaction failed; processing its receipts one transaction each",
				"error", describe(err), "receipts", len(order))
			logged = true
		}
		outcomes[i], anomalies[i] = w.process(ctx, conns, claimed[i])
	}
}

// giveBack releases claimed[order[0]], claimed[order[1]], ..., not started
// when the deadline margin came: after the batch transaction failed with
// err (see oneByOne), or between two transactions of a batch (err nil).
// Only the receipts it released are Released. One that could not be (the
// release failed, or another worker has claimed it since) keeps no outcome
// and its counted attempt, and comes back after its lease; none records a
// failure.
func (w *Worker) giveBack(ctx context.Context, conns connSource, claimed []inbox.Claimed, order []int, outcomes []Outcome, anomalies []bool, err error) {
	rest := make([]inbox.Claimed, len(order))
	for k, i := range order {
		rest[k] = claimed[i]
	}
	wctx := context.WithoutCancel(ctx)
	conn, rerr := conns(wctx)
	var released []inbox.Key
	if rerr == nil {
		released, rerr = inbox.ReleaseKeys(wctx, conn, rest, w.Now())
	}
	if rerr != nil {
		w.logger.ErrorContext(ctx, "releasing claims", "error", rerr, "count", len(rest))
		return
	}
	for _, i := range order {
		if slices.Contains(released, claimed[i].Key) {
			outcomes[i], anomalies[i] = Released, false
		}
	}
	if err != nil {
		w.logger.WarnContext(ctx, "batch transaction failed at the end of the invocation; its receipts are given back",
			"error", describe(err), "receipts", len(rest), "released", len(released))
		return
	}
	w.logger.WarnContext(ctx, "deadline margin reached in the middle of a batch; the receipts not started are given back",
		"receipts", len(rest), "released", len(released))
}

// process applies one claimed receipt in a transaction of its own, on a
// connection from conns, and records the outcome. It reports whether the
// receipt raised an anomaly.
func (w *Worker) process(ctx context.Context, conns connSource, c inbox.Claimed) (Outcome, bool) {
	start := time.Now()
	log := w.logger.With("endpoint", c.Endpoint, "event_id", c.EventID, "event_type", c.EventType, "attempt", c.Attempts)

	var (
		outcome Outcome
		anomaly bool
		latency time.Duration
	)
	err := inTxOn(ctx, conns, func(tx pgx.Tx) error {
		if err := inbox.SetLocalStatementTimeout(ctx, tx, w.cfg.StatementTimeout); err != nil {
			return err
		}
		var err error
		outcome, anomaly, latency, err = w.apply(ctx, tx, c)
		return err
	})
	if err != nil {
		// inTx has rolled back the business work.
		if isDeadlock(err) {
			w.deadlocks.Add(1)
		}
		text := describe(err)
		delay := w.backoff(c.Attempts)
		// Bounded by the statement timeout (not by cancelling a context,
		// which would close the connection): the row may be locked by a
		// worker that took it over after the lease; then this gives up and
		// the lease brings the row back.
		rctx := context.WithoutCancel(ctx)
		if rerr := inTxOn(rctx, conns, func(tx pgx.Tx) error {
			if err := inbox.SetLocalStatementTimeout(rctx, tx, w.cfg.StatementTimeout); err != nil {
				return err
			}
			return inbox.RecordFailure(rctx, tx, c.Key, text, delay, w.Now(), w.cfg.MaxAttempts)
		}); rerr != nil {
			log.ErrorContext(ctx, "recording failure", "error", rerr)
		}
		level := slog.LevelWarn
		if c.Attempts >= w.cfg.MaxAttempts {
			level = slog.LevelError
		}
		log.Log(ctx, level, "receipt failed", "outcome", Failed, "error", text, "retry_in_ms", delay.Milliseconds(),
			"needs_review", c.Attempts >= w.cfg.MaxAttempts, "duration_ms", time.Since(start).Milliseconds())
		return Failed, false
	}
	if outcome != AlreadyDone {
		w.recordLatency(latency)
	}
	log.InfoContext(ctx, "receipt", "outcome", outcome, "anomaly", anomaly, "duration_ms", time.Since(start).Milliseconds())
	return outcome, anomaly
}

// apply is the body of process (one receipt per transaction): lock,
// re-check, handle, mark. It also returns the receipt-to-effect latency of a
// receipt it marked processed (0 otherwise), to be recorded once tx
// commits. processBatch does the same for many receipts at once (batchTx).
func (w *Worker) apply(ctx context.Context, tx pgx.Tx, c inbox.Claimed) (Outcome, bool, time.Duration, error) {
	locked, found, err := inbox.Lock(ctx, tx, c.Key)
	if err != nil {
		return "", false, 0, err
	}
	if !found {
		return AlreadyDone, false, 0, nil
	}
	if !w.books(locked) {
		lat, err := inbox.MarkProcessed(ctx, tx, c.Key, string(IgnoredOtherMode), w.Now())
		if err != nil {
			return "", false, 0, err
		}
		return IgnoredOtherMode, false, lat, nil
	}
	res, err := book(ctx, read(w.handlers, event(c, locked)), tx)
	if err != nil {
		return "", false, 0, err
	}
	lat, err := inbox.MarkProcessed(ctx, tx, c.Key, string(res.Outcome), w.Now())
	if err != nil {
		return "", false, 0, err
	}
	return Outcome(res.Outcome), res.Anomaly, lat, nil
}

// stopAt is when a drainer stops starting work: ctx's deadline less the
// margin (zero when ctx has no deadline).
func (w *Worker) stopAt(ctx context.Context) time.Time {
	if d, ok := ctx.Deadline(); ok {
		return d.Add(-w.cfg.DeadlineMargin)
	}
	return time.Time{}
}

// expired reports whether stopAt (see Worker.stopAt) has come.
func expired(stopAt time.Time) bool { return !stopAt.IsZero() && !time.Now().Before(stopAt) }

// inTx runs fn in a transaction on conn: commit when fn succeeds, otherwise
// roll back on a context that cannot be cancelled, so a deadline that hit fn
// does not also leave the connection with a transaction open.
func inTx(ctx context.Context, conn *pgx.Conn, fn func(pgx.Tx) error) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("beginning transaction: %w", err)
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("committing: %w", err)
	}
	return nil
}

// inPipelinedTx runs fn in a transaction that fn itself opens and
// commits: BEGIN goes in fn's first pipeline (inbox.BeginLockMany: a
// batch's BEGIN, timeouts and lock are one round trip, not three) and
// COMMIT in its last (inbox.MarkManyProcessedCommit: the mark and the
// commit in one), and fn reports whether it committed. Whatever
// transaction is still open on conn when fn returns (fn failed, or
// panicked) is rolled back: nothing of it holds. pgx keeps no state of a
// transaction opened with a BEGIN it did not send (pgx.Tx would send its
// own, alone): the connection's transaction status
// (pgconn.PgConn.TxStatus, from the server's ReadyForQuery) says whether
// one is open.
func inPipelinedTx(ctx context.Context, conn *pgx.Conn, fn func(txConn) (committed bool, err error)) error {
	// A BEGIN inside an open transaction is only a warning: never join one.
	rollbackOpen(ctx, conn)
	defer func() {
		if p := recover(); p != nil {
			rollbackOpen(ctx, conn)
			panic(p)
		}
	}()
	committed, err := fn(txConn{conn})
	if err == nil && !committed {
		err = errors.New("the batch's transaction ended without its commit")
	}
	rollbackOpen(ctx, conn) // none is open after a commit
	return err
}

// lockedOnce checks that every key of done was locked unprocessed by the
// batch's lock (it is in locked) and appears once: then the mark matches
// every one, since no other transaction can change a row this one holds.
func lockedOnce(done []inbox.Key, locked map[inbox.Key]inbox.Locked) error {
	seen := make(map[inbox.Key]bool, len(done))
	for _, k := range done {
		if _, ok := locked[k]; !ok || seen[k] {
			return fmt.Errorf("marking receipt %s/%s/%s processed: not locked by this batch, or twice", k.Provider, k.Endpoint, k.EventID)
		}
		seen[k] = true
	}
	return nil
}

// rollbackOpen rolls back the transaction open on conn, if any. A
// connection that cannot (lost, or in a broken pipeline) is closed by pgx,
// and the server rolls its transaction back when the session ends.
func rollbackOpen(ctx context.Context, conn *pgx.Conn) {
	if conn.IsClosed() || conn.PgConn().TxStatus() == 'I' {
		return
	}
	if _, err := conn.Exec(context.WithoutCancel(ctx), "ROLLBACK"); err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
	}
}

// txConn is a connection inside a transaction inPipelinedTx runs: what
// batch.Run and the inbox's statements need of a transaction.
type txConn struct{ c *pgx.Conn }

func (t txConn) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return t.c.Exec(ctx, sql, args...)
}
func (t txConn) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return t.c.Query(ctx, sql, args...)
}
func (t txConn) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return t.c.QueryRow(ctx, sql, args...)
}
func (t txConn) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return t.c.SendBatch(ctx, b)
}
func (t txConn) Conn() *pgx.Conn { return t.c }

// inTxOn is inTx on a connection from conns.
func inTxOn(ctx context.Context, conns connSource, fn func(pgx.Tx) error) error {
	conn, err := conns(ctx)
	if err != nil {
		return err
	}
	return inTx(ctx, conn, fn)
}

// connSource gives a processing transaction its connection.
type connSource func(context.Context) (*pgx.Conn, error)

// drainConn is a drainer's connection. One that was lost (the server ended
// the session, the network failed) is replaced at the next get, so a lost
// connection costs only the transaction that was on it: the receipts of a
// failed batch are retried, and a failure recorded, on a new one.
type drainConn struct {
	pool *pgxpool.Pool
	conn *pgxpool.Conn
}

func (d *drainConn) get(ctx context.Context) (*pgx.Conn, error) {
	if d.conn != nil && !d.conn.Conn().IsClosed() {
		return d.conn.Conn(), nil
	}
	d.release() // the pool discards a closed connection
	conn, err := d.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("acquiring a connection: %w", err)
	}
	d.conn = conn
	return conn.Conn(), nil
}

func (d *drainConn) release() {
	if d.conn != nil {
		d.conn.Release()
		d.conn = nil
	}
}
