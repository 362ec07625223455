package worker

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/stripe-inbox/inbox/internal/batch"
	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/inbox"
)

// ProcessBatch applies several claimed receipts in one transaction, each
// under its own savepoint, so that they share one commit (one WAL flush)
// instead of paying one each. Per receipt the rules are those of Process:
// lock the row (waiting), re-check it is unprocessed, apply the handler, mark
// it processed. A receipt whose handler fails is rolled back to its savepoint
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
// receipt, which is tried again on its own (as Process does) once the batch
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
func (w *Worker) ProcessBatch(ctx context.Context, conn *pgx.Conn, claimed []inbox.Claimed) ([]Outcome, []bool) {
	return w.processBatch(ctx, fixedConn(conn), claimed)
}

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
		order = w.batchTx(ctx, conns, claimed, order, outcomes, anomalies)
	}
	for k, i := range alone {
		if expired(stopAt) || ctx.Err() != nil {
			w.giveBack(ctx, conns, claimed, alone[k:], outcomes, anomalies, nil)
			break
		}
		outcomes[i], anomalies[i] = w.process(ctx, conns, claimed[i])
	}
	return outcomes, anomalies
}

// lockOrder orders a batch: by the invoice each receipt belongs to; within
// one invoice, invoice events (they take the invoice's row first, then its
// payments' links) before the others (payments and refunds take a link
// first, never the invoice's row after it); then by event id. Every batch
// so takes an invoice's row, then links, then refunds and ledger rows, and
// invoices in one order: no two batches can wait for each other.
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

// refundEvents are the types whose handlers take a charge's or
// PaymentIntent's payment_links row (internal/handlers: chargeRefunded,
// refundChanged) before they know the invoice it belongs to.
var refundEvents = map[string]bool{
	"charge.refunded": true, "refund.created": true, "refund.updated": true,
	"refund.failed": true, "charge.refund.updated": true,
}

// splitUnplaced takes out of order the refund events whose invoice the
// claim could not tell (their LockKey is not an invoice: payment_links did
// not link their charge yet), to be processed one transaction each after
// the batch. In a batch they would take their charge's rows at a place in
// the batch's order that does not follow the invoice they belong to, and a
// batch holding them while it waits for another invoice's rows, held by a
// batch that waits for that charge's (its invoice.paid links it), is a
// deadlock that PostgreSQL breaks only after deadlock_timeout (1 s), again
// and again during a backlog (README, Known problems). Alone, such a
// refund holds nothing while it waits for its charge's row, so it cannot
// close a cycle. Every other receipt keeps its place in the invoice order.
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

// batchTx processes claimed[order[0]], claimed[order[1]], ... in one
// transaction until they are all done or the time budget is spent, commits,
// and returns the receipts it did not start (to go in another transaction).
//
// Round trips: one statement locks every receipt of the batch (a receipt
// another worker completed is AlreadyDone; one of the other mode is marked
// IgnoredOtherMode without its handler); internal/batch runs the handlers,
// each under a savepoint of its own, sending the first statement of many in
// one round trip (see its package comment); failures are recorded (a
// failed handler was rolled back to its savepoint); one statement marks
// the applied receipts processed; and the commit. No handler is started
// once the transaction has run for StatementTimeout, so one slow receipt
// cannot hold the rest of the batch's locks for long.
//
// A handler that deadlocked was rolled back to its savepoint, which
// released its locks, so the other transaction can go on; it still waits
// for this batch's other locks, so the receipt is tried again on its own
// (Process) once this batch has committed, without using up an attempt.
//
// When the transaction itself fails (a statement that fails before it runs,
// at prepare or while its arguments are encoded; a handler that swallowed a
// statement's error, so the transaction is aborted; a lost connection),
// nothing of it committed, and the receipts it took are processed again one
// transaction each, so that only the receipt that caused it records a
// failure. Otherwise the whole batch would come back together after its
// lease (one claim gives its rows one available_at) and fail together, until
// every receipt of it needed review.
func (w *Worker) batchTx(ctx context.Context, conns connSource, claimed []inbox.Claimed, order []int, outcomes []Outcome, anomalies []bool) []int {
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
	err = inTx(ctx, conn, func(tx pgx.Tx) error {
		if err := w.setStatementTimeout(ctx, tx); err != nil {
			return err
		}
		keys := make([]inbox.Key, len(order))
		for j, i := range order {
			keys[j] = claimed[i].Key
		}
		locked, err := inbox.LockMany(ctx, tx, keys)
		if err != nil {
			return err
		}
		var (
			done         []inbox.Key // to be marked processed
			doneOutcomes []string
			jobs         []batch.Job
			jobReceipt   []int // the receipt (index in claimed) of each job
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
				k, ev := len(jobs), event(c, l)
				jobs = append(jobs, func(ctx context.Context, db batch.DB) (err error) {
					results[k], err = applyHandler(ctx, w.handlers, db, ev)
					return err
				})
				jobReceipt = append(jobReceipt, i)
			}
		}
		n, errs, err := batch.Run(ctx, tx, jobs, func() bool { return time.Since(start) < w.cfg.StatementTimeout })
		rest, ran = jobReceipt[n:], true
		if err != nil {
			return err
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
			default:
				text, delay := describe(errs[k]), w.backoff(c.Attempts)
				if err := inbox.RecordFailure(ctx, tx, c.Key, text, delay, w.Now(), w.cfg.MaxAttempts); err != nil {
					return err
				}
				outcomes[i] = Failed
				failures = append(failures, failure{i, text, delay})
			}
		}
		latencies, err = inbox.MarkManyProcessed(ctx, tx, done, doneOutcomes, w.Now())
		return err
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

func isDeadlock(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "40P01"
}
