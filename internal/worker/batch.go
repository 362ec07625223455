package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

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
//
// Round trips per transaction: lock every receipt of the batch in one
// statement, then per receipt a SAVEPOINT and the handler's statements, then
// mark all the applied ones processed in one statement, and commit.
func (w *Worker) batchTx(ctx context.Context, conn *pgx.Conn, batch []inbox.Claimed, order []int, outcomes []Outcome, anomalies []bool) int {
	start := time.Now()
	var taken int
	type failure struct {
		i     int
		err   string
		delay time.Duration
	}
	var failures []failure
	err := inTx(ctx, conn, func(tx pgx.Tx) error {
		if err := w.setStatementTimeout(ctx, tx); err != nil {
			return err
		}
		keys := make([]inbox.Key, len(order))
		for j, i := range order {
			keys[j] = batch[i].Key
		}
		locked, err := inbox.LockMany(ctx, tx, keys)
		if err != nil {
			return err
		}
		var doneKeys []inbox.Key
		var doneOutcomes []string
		for _, i := range order {
			if taken > 0 && time.Since(start) >= w.cfg.StatementTimeout {
				break
			}
			taken++
			c := batch[i]
			l, ok := locked[c.Key]
			if !ok {
				outcomes[i] = AlreadyDone // another worker completed it
				continue
			}
			res, err := w.applyInSavepoint(ctx, tx, c, l)
			if isDeadlock(err) {
				// Rolling back to the savepoint released this receipt's
				// locks, so the other transaction can finish; try once more.
				res, err = w.applyInSavepoint(ctx, tx, c, l)
			}
			if err != nil {
				// The savepoint undid this receipt's work; record the
				// failure in the same transaction.
				text, delay := describe(err), w.backoff(c.Attempts)
				if rerr := inbox.RecordFailure(ctx, tx, c.Key, text, delay, w.Now()); rerr != nil {
					return rerr // the transaction itself is unusable
				}
				outcomes[i] = Failed
				failures = append(failures, failure{i, text, delay})
				continue
			}
			outcomes[i], anomalies[i] = Outcome(res.Outcome), res.Anomaly
			doneKeys = append(doneKeys, c.Key)
			doneOutcomes = append(doneOutcomes, string(res.Outcome))
		}
		return inbox.MarkManyProcessed(ctx, tx, doneKeys, doneOutcomes, w.Now())
	})
	if err != nil {
		if taken == 0 {
			// Locking the batch failed (say a receipt is held past the
			// statement timeout by a worker that took it over after its
			// lease): fall back to one transaction per receipt, so only
			// that receipt waits.
			for _, i := range order {
				outcomes[i], anomalies[i] = w.Process(ctx, conn, batch[i])
			}
			return len(order)
		}
		// Nothing of this transaction committed. Its receipts keep their
		// counted attempts and come back after their lease.
		for _, i := range order[:taken] {
			outcomes[i], anomalies[i] = Failed, false
			c := batch[i]
			w.logger.WarnContext(ctx, "receipt failed", "endpoint", c.Endpoint, "event_id", c.EventID, "event_type", c.EventType,
				"attempt", c.Attempts, "outcome", Failed, "error", describe(err), "retry_after", "lease")
		}
		return taken
	}
	for _, f := range failures {
		c := batch[f.i]
		level := slog.LevelWarn
		if c.Attempts >= w.cfg.MaxAttempts {
			level = slog.LevelError
		}
		w.logger.Log(ctx, level, "receipt failed", "endpoint", c.Endpoint, "event_id", c.EventID, "event_type", c.EventType,
			"attempt", c.Attempts, "outcome", Failed, "error", f.err, "retry_in_ms", f.delay.Milliseconds(),
			"needs_review", c.Attempts >= w.cfg.MaxAttempts)
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

// applyInSavepoint runs one locked receipt's handler under a savepoint of tx,
// rolling back to it on error. The SAVEPOINT travels in the same round trip
// as the handler's first statement (savepointDB), and savepoints are not
// released one by one (the commit releases them all), so a savepoint costs
// no round trip of its own.
func (w *Worker) applyInSavepoint(ctx context.Context, tx pgx.Tx, c inbox.Claimed, l inbox.Locked) (handlers.Result, error) {
	db := &savepointDB{tx: tx}
	res, err := w.handlers.Apply(ctx, db, handlers.Event{ID: c.EventID, Type: l.EventType, Endpoint: c.Endpoint, Payload: l.Payload})
	if err != nil {
		if !db.sent {
			// The handler failed before its first statement: it changed
			// nothing, and there is no savepoint of its own to roll back to
			// (rolling back to the name would undo the previous receipt).
			return handlers.Result{}, err
		}
		if _, rerr := tx.Exec(context.WithoutCancel(ctx), "ROLLBACK TO SAVEPOINT receipt"); rerr != nil {
			return handlers.Result{}, fmt.Errorf("%w (and rolling back to the savepoint: %v)", err, rerr)
		}
		return handlers.Result{}, err
	}
	return res, nil
}

// savepointDB is the handlers.DB of one receipt in a batch: it sends
// "SAVEPOINT receipt" pipelined with the first statement the handler runs.
type savepointDB struct {
	tx   pgx.Tx
	sent bool
}

const savepointSQL = "SAVEPOINT receipt"

// first sends the savepoint and sql in one pipeline and returns the results
// positioned at sql's.
func (s *savepointDB) first(ctx context.Context, sql string, args []any) (pgx.BatchResults, error) {
	s.sent = true
	b := &pgx.Batch{}
	b.Queue(savepointSQL)
	b.Queue(sql, args...)
	br := s.tx.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		br.Close()
		return nil, fmt.Errorf("savepoint: %w", err)
	}
	return br, nil
}

func (s *savepointDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if s.sent {
		return s.tx.Exec(ctx, sql, args...)
	}
	br, err := s.first(ctx, sql, args)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

func (s *savepointDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if s.sent {
		return s.tx.QueryRow(ctx, sql, args...)
	}
	br, err := s.first(ctx, sql, args)
	if err != nil {
		return errRow{err}
	}
	return batchRow{row: br.QueryRow(), br: br}
}

func (s *savepointDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if !s.sent {
		s.sent = true
		if _, err := s.tx.Exec(ctx, savepointSQL); err != nil {
			return nil, fmt.Errorf("savepoint: %w", err)
		}
	}
	return s.tx.Query(ctx, sql, args...)
}

// batchRow scans the row and then closes the pipeline it came from.
type batchRow struct {
	row pgx.Row
	br  pgx.BatchResults
}

func (r batchRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	if cerr := r.br.Close(); err == nil {
		err = cerr
	}
	return err
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

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

func isDeadlock(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "40P01"
}
