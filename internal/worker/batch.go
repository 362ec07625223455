package worker

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

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
// Receipts are processed in business-key order (data.object.id, then event
// id) so that concurrent batches take the rows they share in the same order.
// A transaction is closed early (committed) once it has run for
// StatementTimeout, so one slow receipt cannot hold the rest of the batch's
// locks for long. A deadlock between batches that touch the same objects in
// another order (PostgreSQL aborts one statement) fails only that receipt,
// which is retried.
//
// It returns one outcome per receipt, in the order given, and whether each
// raised an anomaly.
func (w *Worker) ProcessBatch(ctx context.Context, conn *pgx.Conn, batch []inbox.Claimed) ([]Outcome, []bool) {
	order := make([]int, len(batch))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		return cmp.Or(cmp.Compare(batch[a].ObjectID, batch[b].ObjectID), cmp.Compare(batch[a].EventID, batch[b].EventID))
	})
	outcomes := make([]Outcome, len(batch))
	anomalies := make([]bool, len(batch))
	for len(order) > 0 {
		done := w.batchTx(ctx, conn, batch, order, outcomes, anomalies)
		order = order[done:]
	}
	return outcomes, anomalies
}

// batchTx processes batch[order[0]], batch[order[1]], ... in one
// transaction until they are all done or the time budget is spent, commits,
// and returns how many it took.
func (w *Worker) batchTx(ctx context.Context, conn *pgx.Conn, batch []inbox.Claimed, order []int, outcomes []Outcome, anomalies []bool) int {
	start := time.Now()
	var taken int
	type logged struct {
		i       int
		err     string
		delay   time.Duration
		elapsed time.Duration
	}
	var failures []logged
	err := inTx(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT set_config('statement_timeout', $1, true)", fmt.Sprintf("%dms", w.cfg.StatementTimeout.Milliseconds())); err != nil {
			return fmt.Errorf("setting statement_timeout: %w", err)
		}
		for _, i := range order {
			if taken > 0 && time.Since(start) >= w.cfg.StatementTimeout {
				break
			}
			taken++
			c := batch[i]
			t0 := time.Now()
			o, anomaly, err := w.applyInSavepoint(ctx, tx, c)
			if err != nil {
				// The savepoint rolled back this receipt's work; record the
				// failure in the same transaction.
				text, delay := describe(err), w.backoff(c.Attempts)
				if rerr := inbox.RecordFailure(ctx, tx, c.Key, text, delay, w.Now()); rerr != nil {
					return rerr // the transaction itself is unusable
				}
				outcomes[i] = Failed
				failures = append(failures, logged{i, text, delay, time.Since(t0)})
				continue
			}
			outcomes[i], anomalies[i] = o, anomaly
		}
		return nil
	})
	if err != nil {
		// Nothing of this transaction committed. The receipts keep their
		// counted attempts and come back after their lease.
		for _, i := range order[:max(taken, 1)] {
			outcomes[i], anomalies[i] = Failed, false
			c := batch[i]
			w.logger.WarnContext(ctx, "receipt failed", "endpoint", c.Endpoint, "event_id", c.EventID, "event_type", c.EventType,
				"attempt", c.Attempts, "outcome", Failed, "error", describe(err), "retry_after", "lease")
		}
		return max(taken, 1)
	}
	for _, f := range failures {
		c := batch[f.i]
		level := slog.LevelWarn
		if c.Attempts >= w.cfg.MaxAttempts {
			level = slog.LevelError
		}
		w.logger.Log(ctx, level, "receipt failed", "endpoint", c.Endpoint, "event_id", c.EventID, "event_type", c.EventType,
			"attempt", c.Attempts, "outcome", Failed, "error", f.err, "retry_in_ms", f.delay.Milliseconds(),
			"needs_review", c.Attempts >= w.cfg.MaxAttempts, "duration_ms", f.elapsed.Milliseconds())
	}
	for _, i := range order[:taken] {
		if outcomes[i] != Failed {
			c := batch[i]
			w.logger.InfoContext(ctx, "receipt", "endpoint", c.Endpoint, "event_id", c.EventID, "event_type", c.EventType,
				"attempt", c.Attempts, "outcome", outcomes[i], "anomaly", anomalies[i], "batch", taken)
		}
	}
	return taken
}

// applyInSavepoint runs one receipt's lock, re-check, handler and mark
// under a savepoint of tx, rolling back to it on error.
func (w *Worker) applyInSavepoint(ctx context.Context, tx pgx.Tx, c inbox.Claimed) (Outcome, bool, error) {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return "", false, fmt.Errorf("savepoint: %w", err)
	}
	o, anomaly, err := w.apply(ctx, sp, c)
	if err != nil {
		if rerr := sp.Rollback(context.WithoutCancel(ctx)); rerr != nil {
			return "", false, fmt.Errorf("%w (and rolling back to the savepoint: %v)", err, rerr)
		}
		return "", false, err
	}
	if err := sp.Commit(ctx); err != nil {
		return "", false, fmt.Errorf("releasing savepoint: %w", err)
	}
	return o, anomaly, nil
}

// apply is the body shared by Process and ProcessBatch: lock, re-check,
// handle, mark.
func (w *Worker) apply(ctx context.Context, tx pgx.Tx, c inbox.Claimed) (Outcome, bool, error) {
	locked, found, err := inbox.Lock(ctx, tx, c.Key)
	if err != nil {
		return "", false, err
	}
	if !found {
		return AlreadyDone, false, nil
	}
	res, err := w.handlers.Apply(ctx, tx, handlers.Event{ID: c.EventID, Type: locked.EventType, Endpoint: c.Endpoint, Payload: locked.Payload})
	if err != nil {
		return "", false, err
	}
	if err := inbox.MarkProcessed(ctx, tx, c.Key, string(res.Outcome), w.Now()); err != nil {
		return "", false, err
	}
	return Outcome(res.Outcome), res.Anomaly, nil
}
