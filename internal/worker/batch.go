package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
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
func (w *Worker) ProcessBatch(ctx context.Context, conn *pgx.Conn, batch []inbox.Claimed) ([]Outcome, []bool) {
	return w.processBatch(ctx, fixedConn(conn), batch)
}

func (w *Worker) processBatch(ctx context.Context, conns connSource, batch []inbox.Claimed) ([]Outcome, []bool) {
	order := make([]int, len(batch))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		return cmp.Or(cmp.Compare(batch[a].ObjectID, batch[b].ObjectID), cmp.Compare(batch[a].EventID, batch[b].EventID))
	})
	outcomes := make([]Outcome, len(batch))
	anomalies := make([]bool, len(batch))
	stopAt := w.stopAt(ctx)
	for first := true; len(order) > 0; first = false {
		// As the drainer checks before each batch: a transaction started
		// past the margin could run into the end of the invocation.
		if !first && (expired(stopAt) || ctx.Err() != nil) {
			w.giveBack(ctx, conns, batch, order, outcomes, anomalies, nil)
			break
		}
		done := w.batchTx(ctx, conns, batch, order, outcomes, anomalies)
		order = order[done:]
	}
	return outcomes, anomalies
}

// batchTx processes batch[order[0]], batch[order[1]], ... in one
// transaction until they are all done or the time budget is spent, commits,
// and returns how many it took.
//
// Round trips: one statement locks every receipt of the batch; then the
// receipts go in waves, each one round trip that carries, for every receipt
// of the wave, a SAVEPOINT of its own and its handler's first statement
// (most handlers need no other); one statement marks all the applied
// receipts processed; and the commit.
//
// The replies of a wave are handed to the handlers in order. A handler that
// wants a further statement cuts the wave: the receipts after it are rolled
// back to their savepoints, it finishes on its own, and they are sent again
// in the next wave, so a receipt's statements always run together under its
// savepoint. A handler that fails is rolled back to its savepoint (with the
// receipts after it, which are sent again) and its failure is recorded. The
// wave size halves after a cut and doubles after a wave without one, so
// when most handlers need several statements, waves shrink to one receipt
// and little work is sent twice.
//
// When the transaction itself fails (a statement that fails before it runs,
// at prepare or while its arguments are encoded; a handler that swallowed a
// statement's error, so the transaction is aborted; a lost connection),
// nothing of it committed, and the receipts it took are processed again one
// transaction each, so that only the receipt that caused it records a
// failure. Otherwise the whole batch would come back together after its
// lease (one claim gives its rows one available_at) and fail together, until
// every receipt of it needed review.
func (w *Worker) batchTx(ctx context.Context, conns connSource, batch []inbox.Claimed, order []int, outcomes []Outcome, anomalies []bool) int {
	start := time.Now()
	var taken int
	s := &batchState{w: w, ctx: ctx, batch: batch, outcomes: outcomes, anomalies: anomalies}
	defer func() {
		for _, r := range s.runs {
			r.stop()
		}
	}()
	conn, err := conns(ctx)
	if err != nil {
		return w.oneByOne(ctx, conns, batch, order, outcomes, anomalies, err)
	}
	var latencies []time.Duration
	err = inTx(ctx, conn, func(tx pgx.Tx) error {
		s.tx = tx
		if err := w.setStatementTimeout(ctx, tx); err != nil {
			return err
		}
		keys := make([]inbox.Key, len(order))
		for j, i := range order {
			keys[j] = batch[i].Key
		}
		var err error
		if s.locked, err = inbox.LockMany(ctx, tx, keys); err != nil {
			return err
		}
		var queue []*waveItem // taken receipts whose handlers wait on their first statement
		size := len(order)
		for {
			for len(queue) < size && taken < len(order) && (taken == 0 || time.Since(start) < w.cfg.StatementTimeout) {
				it, err := s.start(order[taken])
				taken++
				if err != nil {
					return err
				}
				if it != nil {
					queue = append(queue, it)
				}
			}
			if len(queue) == 0 {
				break
			}
			n := 0
			for n < min(len(queue), size) && queue[n].run.pending.kind != queryCall {
				n++
			}
			wave := queue[:max(n, 1)] // a Query (rows) goes alone
			settled, cut, err := s.runWave(wave)
			if err != nil {
				return err
			}
			queue = queue[settled:]
			if cut {
				size = max(1, size/2)
			} else {
				size = min(len(order), size*2)
			}
		}
		var err2 error
		latencies, err2 = inbox.MarkManyProcessed(ctx, tx, s.doneKeys, s.doneOutcomes, w.Now())
		return err2
	})
	if err != nil {
		// Nothing of this transaction committed. Fall back to one
		// transaction per receipt for those it took (all of them when
		// locking the batch failed, say because a receipt is held past the
		// statement timeout by a worker that took it over after its lease),
		// so only the receipt that caused the failure fails.
		n := taken
		if n == 0 {
			n = len(order)
		}
		return w.oneByOne(ctx, conns, batch, order[:n], outcomes, anomalies, err)
	}
	w.recordLatency(latencies...)
	for _, f := range s.failures {
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
		if outcomes[i] != Failed && !slices.Contains(s.alone, i) {
			c := batch[i]
			w.logger.InfoContext(ctx, "receipt", "endpoint", c.Endpoint, "event_id", c.EventID, "event_type", c.EventType,
				"attempt", c.Attempts, "outcome", outcomes[i], "anomaly", anomalies[i], "batch", taken)
		}
	}
	for _, i := range s.alone {
		outcomes[i], anomalies[i] = w.process(ctx, conns, batch[i])
	}
	return taken
}

// oneByOne processes batch[order[0]], batch[order[1]], ... one transaction
// each, after the batch transaction failed with err, and returns how many it
// took (all). Before each receipt it checks, as the drainer does before each
// batch, that the invocation's deadline margin is not reached (and ctx is not
// done): from then on it gives the receipts it has not started back
// (inbox.Release, fenced: one another worker has claimed since is not ours),
// with their attempt uncounted, to be claimed again at once. Processing them
// past the margin could run into the end of the invocation and record
// deadline or canceled failures on receipts that did nothing wrong.
func (w *Worker) oneByOne(ctx context.Context, conns connSource, batch []inbox.Claimed, order []int, outcomes []Outcome, anomalies []bool, err error) int {
	stopAt := w.stopAt(ctx)
	logged := false
	for k, i := range order {
		if expired(stopAt) || ctx.Err() != nil {
			w.giveBack(ctx, conns, batch, order[k:], outcomes, anomalies, err)
			break
		}
		if !logged {
			w.logger.WarnContext(ctx, "batch transaction failed; processing its receipts one transaction each",
				"error", describe(err), "receipts", len(order))
			logged = true
		}
		outcomes[i], anomalies[i] = w.process(ctx, conns, batch[i])
	}
	return len(order)
}

// giveBack releases batch[order[0]], batch[order[1]], ..., not started
// when the deadline margin came: after the batch transaction failed with
// err (see oneByOne), or between two transactions of a batch (err nil).
// Only the receipts it released are Released. One that could not be (the
// release failed, or another worker has claimed it since) keeps no outcome
// and its counted attempt, and comes back after its lease; none records a
// failure.
func (w *Worker) giveBack(ctx context.Context, conns connSource, batch []inbox.Claimed, order []int, outcomes []Outcome, anomalies []bool, err error) {
	rest := make([]inbox.Claimed, len(order))
	for k, i := range order {
		rest[k] = batch[i]
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
		if slices.Contains(released, batch[i].Key) {
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

// batchState is one batch transaction in progress.
type batchState struct {
	w         *Worker
	ctx       context.Context
	tx        pgx.Tx
	batch     []inbox.Claimed
	locked    map[inbox.Key]inbox.Locked
	outcomes  []Outcome
	anomalies []bool

	runs         []*handlerRun // every handler started, stopped when the transaction ends
	doneKeys     []inbox.Key   // applied, to be marked processed
	doneOutcomes []string
	failures     []failure // rolled back and recorded
	alone        []int     // deadlocked: retried on their own after the commit
}

type failure struct {
	i     int
	err   string
	delay time.Duration
}

// waveItem is a taken receipt whose handler is running.
type waveItem struct {
	i   int // index in the batch
	run *handlerRun
}

// start takes batch[i] into the transaction: it runs its handler up to its
// first statement, and returns it then. A receipt another worker completed,
// or whose handler returned without a statement, is settled at once (nil).
func (s *batchState) start(i int) (*waveItem, error) {
	c := s.batch[i]
	l, ok := s.locked[c.Key]
	if !ok {
		s.outcomes[i] = AlreadyDone // another worker completed it
		return nil, nil
	}
	if !s.w.books(l) {
		s.outcomes[i] = IgnoredOtherMode
		s.doneKeys = append(s.doneKeys, c.Key)
		s.doneOutcomes = append(s.doneOutcomes, string(IgnoredOtherMode))
		return nil, nil
	}
	it := &waveItem{i: i, run: startHandler(s.ctx, s.w.handlers, event(c, l))}
	s.runs = append(s.runs, it.run)
	if it.run.done() {
		return nil, s.finish(it, "")
	}
	return it, nil
}

// runWave sends the wave and hands the replies to its handlers in order. It
// returns how many of them it settled (the rest wait, their first statement
// pending, for the next wave) and whether the wave was cut short.
func (s *batchState) runWave(wave []*waveItem) (settled int, cut bool, err error) {
	sent, err := sendWave(s.ctx, s.tx, wave)
	if err != nil {
		return 0, false, err
	}
	for k, it := range wave[:sent] {
		it.run.resume()
		if !it.run.done() {
			// It wants another statement: undo the statements of the
			// receipts after it, and let it finish alone.
			cut = true
			if k+1 < sent {
				if _, err := s.tx.Exec(s.ctx, "ROLLBACK TO SAVEPOINT "+savepointName(k+1)); err != nil {
					return 0, false, fmt.Errorf("rolling back the rest of a wave: %w", err)
				}
			}
			for !it.run.done() {
				runDirect(s.ctx, s.tx, it.run.pending)
				it.run.statements++
				it.run.resume()
			}
		}
		if it.run.err != nil && it.run.statements > 0 {
			cut = true // rolling back to its savepoint undoes the receipts after it
		}
		if err := s.finish(it, savepointName(k)); err != nil {
			return 0, false, err
		}
		if cut {
			return k + 1, true, nil
		}
	}
	return sent, sent < len(wave), nil
}

// finish settles a receipt whose handler has returned. sp is its savepoint,
// if it ran statements.
func (s *batchState) finish(it *waveItem, sp string) error {
	c, r := s.batch[it.i], it.run
	if r.err == nil {
		s.outcomes[it.i], s.anomalies[it.i] = Outcome(r.res.Outcome), r.res.Anomaly
		s.doneKeys = append(s.doneKeys, c.Key)
		s.doneOutcomes = append(s.doneOutcomes, string(r.res.Outcome))
		return nil
	}
	if r.statements > 0 {
		if _, err := s.tx.Exec(context.WithoutCancel(s.ctx), "ROLLBACK TO SAVEPOINT "+sp); err != nil {
			return fmt.Errorf("%w (and rolling back to the savepoint: %v)", r.err, err)
		}
	}
	if isDeadlock(r.err) {
		// Rolling back to the savepoint released this receipt's locks, so
		// the other transaction can go on; it still waits for this batch's
		// other locks, so the receipt is tried again on its own once this
		// batch has committed.
		s.alone = append(s.alone, it.i)
		return nil
	}
	text, delay := describe(r.err), s.w.backoff(c.Attempts)
	if err := inbox.RecordFailure(s.ctx, s.tx, c.Key, text, delay, s.w.Now(), s.w.cfg.MaxAttempts); err != nil {
		return err // the transaction itself is unusable
	}
	s.outcomes[it.i] = Failed
	s.failures = append(s.failures, failure{it.i, text, delay})
	return nil
}

func savepointName(k int) string { return "receipt_" + strconv.Itoa(k) }

// sendWave sends, in one round trip, a savepoint and the pending call of
// each handler of the wave, and stores the replies in the calls. It returns
// how many of them ran: the statements after one that failed did not (the
// server skips the rest of the pipeline). A lone Query runs directly after
// its savepoint, since its rows are read while the handler resumes.
func sendWave(ctx context.Context, tx pgx.Tx, wave []*waveItem) (int, error) {
	if len(wave) == 1 && wave[0].run.pending.kind == queryCall {
		if _, err := tx.Exec(ctx, "SAVEPOINT "+savepointName(0)); err != nil {
			return 0, fmt.Errorf("savepoint: %w", err)
		}
		runDirect(ctx, tx, wave[0].run.pending)
		wave[0].run.statements++
		return 1, nil
	}
	b := &pgx.Batch{}
	for k, it := range wave {
		b.Queue("SAVEPOINT " + savepointName(k))
		b.Queue(it.run.pending.sql, it.run.pending.args...)
	}
	br := tx.SendBatch(ctx, b)
	sent, failed := 0, false
	for _, it := range wave {
		if _, err := br.Exec(); err != nil {
			br.Close()
			return sent, fmt.Errorf("savepoint: %w", err)
		}
		readResult(br, tx.Conn().TypeMap(), it.run.pending)
		it.run.statements++
		sent++
		if it.run.pending.err != nil {
			failed = true
			break
		}
	}
	if err := br.Close(); err != nil && !failed {
		return sent, err
	}
	return sent, nil
}

// apply is the body shared by Process and ProcessBatch: lock, re-check,
// handle, mark.
// It also returns the receipt-to-effect latency of a receipt it marked
// processed (0 otherwise), to be recorded once tx commits.
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
	res, err := applyHandler(ctx, w.handlers, tx, event(c, locked))
	if err != nil {
		return "", false, 0, err
	}
	lat, err := inbox.MarkProcessed(ctx, tx, c.Key, string(res.Outcome), w.Now())
	if err != nil {
		return "", false, 0, err
	}
	return Outcome(res.Outcome), res.Anomaly, lat, nil
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

func isDeadlock(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "40P01"
}
