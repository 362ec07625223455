// Package batch runs several jobs in one PostgreSQL transaction, each
// undone alone when it fails (a savepoint of its own, or a restart; see
// below), and sends the statements of many jobs in one round trip. It is
// what makes the worker's batches cheap where a round trip is expensive
// (through RDS Proxy about 1 ms): a batch of 50 receipts whose handlers
// need one statement each costs one round trip, not 100.
//
// Design. Each job is plain sequential code written against DB; Run runs it
// as a coroutine (iter.Pull), so every call it makes suspends it and hands
// the call to Run. Run sends waves: a wave is one pipeline that carries the
// next statement of every pending job (one that sent statements and wants
// another), then, for each of the next jobs in order, a SAVEPOINT named
// after the job's position (r<position>; left out for some jobs of steady
// classes, below) followed by its first statement. The replies are handed
// to the jobs in order; a job that wants a further statement is pending,
// and sends it with the next wave.
//
// Keys (RunClasses, issue 24). Jobs of different keys touch different rows
// (the worker's key is the receipt's invoice), so their statements may
// interleave: a job's second statement may run after the first statements
// of the jobs after it. Jobs of one key, or without one (every job of
// Run), never interleave: every statement of a job runs before any
// statement of a later job it conflicts with. So a wave takes the next
// jobs up to the first that conflicts with a job that may want a further
// statement after the wave (a pending job, or a job of the wave, whose
// class usually takes more statements than it has sent: Shapes). The
// statements of pending jobs that run after statements of later jobs take
// locks out of the jobs' order; with Classes.LockWait they wait for one at
// most that long (see there). A job
// that wants a statement more than its class led to expect, when a job
// after it in the wave conflicts with it, cuts the wave there: the next
// round trip first rolls back to that job's savepoint, and the jobs from
// it on are sent again, after the statement. A job that wanted more than
// two statements blocks the jobs it conflicts with until it is done. The
// wave size halves after a wave that sent jobs again and doubles after a
// wave without one. Without keys, a job's statements run together,
// directly after its savepoint, as before keys: a job of several
// statements ends the wave it is in, and its second statement heads the
// next one.
//
// Failures. A job that fails in its first wave is rolled back to its
// savepoint, with the jobs after it in the wave (sent again in the next).
// A job that fails later, when statements of the jobs after it may have
// run since its savepoint, stands failed, and the run restarts (restartAt):
// it rolls back to the latest savepoint at or before the job after which
// no job before it ran a statement, and runs the jobs from there again
// (the failed ones are not: a job that hit a deadlock or a lock timeout
// would wait on the same lock again). Those jobs' statements run twice,
// the first time undone, and so they count once: a job's effect is what
// its last run left, which is why a Job must keep nothing outside the
// transaction but what its last run leaves.
//
// Savepoints only where a rollback may need them (RunClasses, issue 24).
// A savepoint per job is a statement per job, and its subtransaction: in
// a drain of jobs of one statement each, half of the statements a batch
// sends. A job needs its own savepoint only if the job before it may want
// a further statement (a cut rolls back to the savepoint of the job after
// the one that cut) or it may fail itself. Once Shapes has seen steadyAfter
// jobs of a class (at least), it knows whether the class always took one
// statement and whether it never failed: a job of a class that never
// failed, after a job of a class that always took one statement, is sent
// without a savepoint of its own. The first job of every wave keeps its
// savepoint. Should the job before it want a second statement after all
// and conflict with it, or the job fail, the rollback needed is to a
// savepoint left out: the run then restarts from the savepoint before it,
// each job from there under its own savepoint for the rest of the run.
//
// Jobs of a class that usually needs several statements (Shapes learns it
// from the jobs that ran, say a pre-basil charge.refunded, which links its
// charge to the invoice before it books its refunds) are known before they
// run, so no job they conflict with is sent after them in their wave: in a
// mix where one job in ten is of such a class, cutting the wave at it
// instead sends most jobs two or three times (issue 24).
// A call that returns rows (Query) is read while its job runs, so it goes
// alone. A job's context is honoured on both paths: a call whose context is
// done is not sent and fails with the context's error; a call that runs
// alone runs under its own context; calls sent together run under Run's
// context (one round trip cannot be cancelled for one of them alone) and are
// bounded by the transaction's statement_timeout like every statement.
package batch

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what a job sees: the transaction, with pgx's methods. A job uses it
// only from its own goroutine, reads a row (Scan) or closes Rows before its
// next call, and keeps to the transaction it is given (no COMMIT, ROLLBACK
// or savepoints of its own).
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Tx is the transaction the jobs run in: a pgx.Tx, or a connection in a
// transaction block its caller opened with BEGIN (the worker opens it in
// the pipeline that locks the batch's receipts).
type Tx interface {
	DB
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	Conn() *pgx.Conn
}

// Job is one unit of work in a batch. A job that returns an error has its
// statements rolled back (to its savepoint, or with a restart); one that
// returns nil keeps its statements in the transaction. A job that panics
// panics Run: recover in the job. A job may be started more than once in
// a Run (RunClasses restarts jobs whose statements it rolled back): only
// its last run's statements stand, so whatever it keeps outside the
// transaction must be what its last run leaves (a result it overwrites,
// not a count it adds to). Each run of a job is a goroutine of its own,
// which starts with a small stack: work that recurses deeply (decoding
// JSON) is cheaper done before, by the caller (the worker reads each
// receipt's event first; see handlers.Handler).
type Job func(ctx context.Context, db DB) error

// Run runs jobs[0], jobs[1], ... in tx, in order, each under a savepoint of
// its own, until they have all run or more reports false (asked before each
// job after the first; nil: always more). It returns how many jobs it ran,
// and each one's error: nil when its statements are in tx, else the job's
// error, and its statements were rolled back (tx is usable).
//
// An error from Run means tx itself is unusable (a savepoint or a rollback
// to one failed, the connection was lost, a job swallowed a statement's
// error and went on in an aborted transaction): the caller rolls back, and
// nothing of the jobs holds.
func Run(ctx context.Context, tx Tx, jobs []Job, more func() bool) (int, []error, error) {
	return RunClasses(ctx, tx, jobs, Classes{}, more)
}

// Classes says what class each job is of (jobs[i]'s is Of[i]; the worker's
// is the event type) and where the shapes of the classes are learned. The
// zero value: no classes, nothing learned, every wave as Run sends it.
type Classes struct {
	Of []string
	// Keys: jobs[i]'s is Keys[i]. Jobs of different keys touch different
	// rows, so their statements may interleave; a job without one (""),
	// or past the end of Keys, interleaves with none.
	Keys   []string
	Shapes *Shapes
	// LockWait, when above 0, bounds the lock waits (lock_timeout, set for
	// those statements alone) of the statements of pending jobs sent after
	// statements of jobs after them: the transaction then holds rows of
	// later keys while it waits for one of an earlier key, out of the order
	// the jobs are in, and another transaction that takes the same rows in
	// that order could be waiting for it (a deadlock, which PostgreSQL
	// breaks only after deadlock_timeout). Such a statement fails with
	// lock_not_available (SQLSTATE 55P03) instead, and its job with it.
	LockWait time.Duration
}

// RunClasses is Run, learning in c.Shapes how many statements the jobs of
// each class make, and letting the statements of jobs of different keys
// (c.Keys) interleave (see the package comment). Which jobs share a round
// trip changes only the round trips, never what is applied.
func RunClasses(ctx context.Context, tx Tx, jobs []Job, c Classes, more func() bool) (int, []error, error) {
	r := &runner{ctx: ctx, tx: tx, errs: make([]error, 0, len(jobs)), classes: c, fewer: c.Shapes != nil,
		failedAt: make([]error, len(jobs)), recorded: make([]bool, len(jobs)), at: make([]*coroutine, len(jobs))}
	defer func() {
		for _, c := range r.started {
			c.stop()
		}
	}()
	var (
		queue   []*coroutine // started jobs waiting on their first statement
		pending []*coroutine // jobs that sent statements and want another, in order
	)
	size := len(jobs)
	for {
		for len(queue) < size && len(r.errs) < len(jobs) && (len(r.errs) == 0 || r.failedAt[len(r.errs)] != nil || more == nil || more()) {
			if err := r.failedAt[len(r.errs)]; err != nil {
				// It failed before a restart: not run again, and
				// reported failed whatever more says now.
				r.errs = append(r.errs, err)
				continue
			}
			c := r.start(jobs[len(r.errs)])
			if c.done() {
				r.errs[c.pos] = c.err // no statement ran: nothing to roll back
				continue
			}
			queue = append(queue, c)
		}
		still, err := r.advanceAlone(pending)
		if err == nil {
			pending = still
			if len(queue) == 0 && len(pending) == 0 {
				break
			}
			var (
				consumed int
				cut      bool
			)
			still, consumed, cut, err = r.runWave(pending, queue, size)
			if err == nil {
				pending, queue = still, queue[consumed:]
				if cut {
					size = max(1, size/2)
				} else {
					size = min(len(jobs), size*2)
				}
				continue
			}
		}
		if !errors.Is(err, errRestart) {
			return len(r.errs), r.errs, err
		}
		// A rollback undid the jobs from a savepoint on (restartAt): they
		// run again; the jobs before it that want a further statement go
		// on (of the wave's, too: the restart may come from a job after
		// them in it).
		queue, pending = nil, r.pendingBefore(len(r.errs))
	}
	// A restart whose jobs then sent nothing (their context done) still
	// undoes what they did before it.
	if err := r.flushRollback(); err != nil {
		return len(r.errs), r.errs, err
	}
	if p := r.pendingBefore(len(r.errs)); len(p) > 0 {
		// Never reached: a job left half done must not commit.
		return len(r.errs), r.errs, fmt.Errorf("batch: job %d still wants a statement at the end of the run", p[0].pos)
	}
	return len(r.errs), r.errs, nil
}

// pendingBefore is the jobs before position end, in order, that sent
// statements and want another.
func (r *runner) pendingBefore(end int) []*coroutine {
	var pending []*coroutine
	for _, c := range r.at[:end] {
		if c != nil && !c.done() && c.statements > 0 {
			pending = append(pending, c)
		}
	}
	return pending
}

// runner is one Run in progress.
type runner struct {
	ctx     context.Context
	tx      Tx
	classes Classes
	// rollback is a savepoint the next round trip first rolls back to
	// ("" when none): that of the first of the jobs a cut undid, or the
	// one a restart goes back to.
	rollback string
	errs     []error      // one per job started, in order
	started  []*coroutine // every job started, stopped when Run returns
	at       []*coroutine // the job at each position, as last started
	// seq numbers the statements sent (savepoints included), in the order
	// the server runs them: a rollback to a savepoint undoes every
	// statement numbered after it (restartAt).
	seq int
	// fewer: a job of a class known never to fail, after a job of a class
	// known to take one statement, is sent without a savepoint of its own
	// (savepoints); true until a rollback needs a savepoint so left out
	// (restartAt), then every job has its own.
	fewer bool
	// failedAt holds, by position, the error of each job whose failure
	// restarted the run: it is not run again (a job that hit a deadlock or
	// a lock timeout would wait on the same lock again, with the
	// transaction's locks held); it stands failed, rolled back with the
	// restart. So every restart for a failure leaves one job fewer to run,
	// and a run restarts at most once per job (and once more for a
	// savepoint left out: then fewer is off).
	failedAt []error
	// recorded: the jobs Shapes has counted, by position, so that a job
	// started again after a restart counts once.
	recorded []bool
}

// errRestart: a rollback undid jobs that had run; the run goes on from
// the job of the savepoint it rolled back to (restartAt).
var errRestart = errors.New("batch: restart from an earlier savepoint")

// savepoints decides which jobs of wave (the jobs whose first statement
// it sends, after the pending jobs heads) are sent after a savepoint of
// their own. Every job is, unless fewer: then the first of the wave is,
// and a job after it only when it is the first after a job it conflicts
// with that may want a further statement (a pending one, or one of the
// wave of a class not known to take one statement: a cut rolls back to
// the savepoint of the first job after it that conflicts with it), or when it
// may fail (its class is not known never to: a failure rolls back to the
// job's own savepoint). A rollback whose savepoint was left out all the
// same (a job of a class known to take one statement took two, or one
// known never to fail failed) restarts the run from the savepoint before
// it (restartAt).
func (r *runner) savepoints(heads, wave []*coroutine) {
	var may []*coroutine // the jobs before that may want a further statement
	if r.fewer {
		may = slices.Clone(heads)
	}
	for i, c := range wave {
		c.savepoint = savepointName(c.pos)
		if !r.fewer {
			continue
		}
		// c is the cut's target for the jobs of may it conflicts with.
		target := false
		may = slices.DeleteFunc(may, func(b *coroutine) bool {
			conflict := r.conflict(b, c)
			target = target || conflict
			return conflict
		})
		if i > 0 && !target {
			if _, neverFails := r.classes.Shapes.steady(r.class(c.pos)); neverFails {
				c.savepoint = ""
			}
		}
		if oneStatement, _ := r.classes.Shapes.steady(r.class(c.pos)); !oneStatement {
			may = append(may, c)
		}
	}
}

// savepointFor is the savepoint to roll back to for the job c and those
// after it in its wave: its own, or, when it was left out, errRestart after
// restartAt. failed is c's error when c failed (it is then not run again),
// nil for a cut.
func (r *runner) savepointFor(c *coroutine, failed error) (string, error) {
	if c.savepoint != "" {
		return c.savepoint, nil
	}
	return "", r.restartFor(c, failed)
}

// failInterleaved settles c, a job that failed after a wave past its first
// (statements of jobs after it may have run since its savepoint): it stands
// failed, and the run restarts from its savepoint (restartAt), or from an
// earlier one when the statements of a job before it ran since.
func (r *runner) failInterleaved(c *coroutine) error {
	return r.restartFor(c, c.err)
}

// restartFor restarts the run for c (restartAt): c stands failed when
// failed is not nil (not run again; Shapes learns that its class fails),
// and when c's savepoint was left out, every job from then on has its own.
func (r *runner) restartFor(c *coroutine, failed error) error {
	if failed != nil {
		r.failedAt[c.pos] = failed
		r.settle(c)
	}
	if c.savepoint == "" {
		r.fewer = false
	}
	return r.restartAt(c.pos)
}

// restartAt rolls back (with the next round trip) to a savepoint at or
// before the job at pos, and starts the jobs from there again. The
// savepoint is the latest one at or before pos after which no job before
// it ran a statement (a pending job's later statements run after the
// savepoints of the jobs after it): the rollback undoes only jobs that run
// again. What those jobs did is undone with the rollback; their coroutines
// are stopped first (a job stopped mid-way gets errAbandoned from its call
// and returns), so nothing of theirs is left to run beside the new ones.
// Returns errRestart.
func (r *runner) restartAt(pos int) error {
	from := pos
	for {
		sp := -1
		for p := min(from, len(r.at)-1); p >= 0; p-- {
			if c := r.at[p]; c != nil && c.savepoint != "" {
				sp = p
				break
			}
		}
		if sp < 0 {
			return fmt.Errorf("batch: no savepoint at or before job %d", pos) // every wave's first job has one
		}
		low := sp
		for _, c := range r.at[:sp] {
			if c != nil && c.lastSeq > r.at[sp].spSeq {
				low = min(low, c.pos)
			}
		}
		if low == sp {
			from = sp
			break
		}
		from = low
	}
	for p := from; p < len(r.at); p++ {
		if c := r.at[p]; c != nil {
			c.stop()
			r.at[p] = nil
		}
	}
	r.rollback = savepointName(from)
	r.errs = r.errs[:from]
	return errRestart
}

// class is the class of the job at pos ("" when none was given).
func (r *runner) class(pos int) string {
	if pos < len(r.classes.Of) {
		return r.classes.Of[pos]
	}
	return ""
}

// conflict reports whether the statements of a and b must not interleave:
// they have the same key, or either has none.
func (r *runner) conflict(a, b *coroutine) bool {
	if a.pos >= len(r.classes.Keys) || b.pos >= len(r.classes.Keys) {
		return true
	}
	ka, kb := r.classes.Keys[a.pos], r.classes.Keys[b.pos]
	return ka == "" || kb == "" || ka == kb
}

// settle records what the job made of its class, once it has returned.
func (r *runner) settle(c *coroutine) {
	if class := r.class(c.pos); class != "" && c.statements > 0 && !r.recorded[c.pos] {
		r.recorded[c.pos] = true
		r.classes.Shapes.record(class, c.statements, c.err != nil)
	}
}

// start starts the next job and runs it up to its first call (or its
// return). A call whose context is already done is answered with the
// context's error without being sent.
func (r *runner) start(job Job) *coroutine {
	c := startJob(r.ctx, len(r.errs), job)
	c.expect = r.classes.Shapes.expect(r.class(c.pos))
	r.errs = append(r.errs, nil)
	r.started = append(r.started, c)
	r.at[c.pos] = c
	c.skipDone()
	return c
}

// advanceAlone readies the pending jobs for the next wave: a call whose
// context is done is answered without being sent (skipDone), and a Query
// runs alone (its rows are read while the job runs). A job that returns
// is settled; one that failed restarts the run (failInterleaved). It
// returns the jobs still pending.
func (r *runner) advanceAlone(pending []*coroutine) ([]*coroutine, error) {
	still := make([]*coroutine, 0, len(pending))
	for _, c := range pending {
		c.skipDone()
		for !c.done() && c.pending.kind == queryCall {
			if err := r.flushRollback(); err != nil {
				return nil, err
			}
			c.pending.runOn(r.tx)
			r.ran(c)
			c.resume()
			c.skipDone()
		}
		if !c.done() {
			still = append(still, c)
			continue
		}
		if c.err != nil {
			return nil, r.failInterleaved(c)
		}
		r.errs[c.pos] = nil
		r.settle(c)
	}
	return still, nil
}

// ran records that c's pending call was sent and ran.
func (r *runner) ran(c *coroutine) {
	r.seq++
	c.lastSeq = r.seq
	c.statements++
}

// runWave sends one wave: the next statement of each pending job, then the
// first statement of as many queued jobs as may follow them (up to size,
// and up to the first that may not interleave with a job that will want a
// further statement after this wave: see blocks), each after its
// savepoint (savepoints); and hands the replies to the jobs in order. A job
// that wants a further statement stays pending; should a job sent after it
// in the wave conflict with it, the wave is cut there: rolled back (with
// the next round trip) to that job's savepoint, and the jobs from it on
// wait for the next wave. A queued job that fails is rolled back to its
// savepoint, with the jobs after it; a pending job that fails restarts the
// run (failInterleaved). It returns the jobs pending after the wave, how
// many queued jobs it consumed (settled or pending), and whether jobs were
// sent again or not at all (the wave was cut short).
func (r *runner) runWave(pending, queue []*coroutine, size int) (still []*coroutine, consumed int, cut bool, err error) {
	var blockers []*coroutine
	for _, c := range pending {
		if c.blocks(1) {
			blockers = append(blockers, c)
		}
	}
	n := 0
	for n < min(len(queue), size) {
		q := queue[n]
		if q.pending.kind == queryCall {
			if len(pending) == 0 && n == 0 {
				n = 1 // a Query goes alone
			}
			break
		}
		if slices.ContainsFunc(blockers, func(b *coroutine) bool { return r.conflict(b, q) }) {
			break
		}
		n++
		if q.blocks(1) {
			blockers = append(blockers, q)
		}
	}
	wave := queue[:n]
	r.savepoints(pending, wave)
	heads := len(pending)
	all := append(slices.Clone(pending), wave...)
	sent, err := r.send(all, heads, r.outOfOrder(pending))
	if err != nil {
		return nil, 0, false, err
	}
	end := sent // the jobs from end on are sent again (or were not sent)
	for k := 0; k < end; k++ {
		c := all[k]
		c.resume()
		c.skipDone()
		if !c.done() {
			if c.statements >= c.expect {
				// More than its class led to expect: a second statement
				// heads the next wave as expected of a class of two; from a
				// third on, it blocks the jobs it conflicts with until done.
				c.expect = c.statements + 1
				if c.statements > 1 {
					c.expect = math.MaxInt
				}
			}
			for j := max(k+1, heads); j < end; j++ {
				if r.conflict(c, all[j]) {
					end = j
					break
				}
			}
			still = append(still, c)
			continue
		}
		if c.err != nil {
			if k < heads {
				return nil, 0, false, r.failInterleaved(c)
			}
			// Rolling back to its savepoint undoes the jobs after it.
			sp, err := r.savepointFor(c, c.err)
			if err != nil {
				return nil, 0, false, err
			}
			if _, err := r.tx.Exec(context.WithoutCancel(r.ctx), "ROLLBACK TO SAVEPOINT "+sp); err != nil {
				return nil, 0, false, fmt.Errorf("%w (and rolling back to the savepoint: %v)", c.err, err)
			}
			r.errs[c.pos] = c.err
			r.failedAt[c.pos] = c.err // should a restart go back past it
			r.settle(c)
			r.unsend(all[k+1:])
			return still, k + 1 - heads, true, nil
		}
		r.errs[c.pos] = nil
		r.settle(c)
	}
	// Pending jobs a statement that failed before theirs kept from running
	// (a pending job that swallowed its statement's error) send it again.
	still = append(still, all[min(end, heads):heads]...)
	if end < sent {
		sp, err := r.savepointFor(all[end], nil)
		if err != nil {
			return nil, 0, false, err
		}
		r.rollback = sp
	}
	r.unsend(all[max(end, heads):])
	return still, max(0, end-heads), end < len(all), nil
}

// outOfOrder is how many of the pending jobs (a prefix: they are in
// order) send their statements after statements of jobs after them that
// stand: those wait for locks at most Classes.LockWait (see there). A job
// that failed and was rolled back has no statement that stands.
func (r *runner) outOfOrder(pending []*coroutine) int {
	if len(pending) == 0 || r.classes.LockWait <= 0 {
		return 0
	}
	last := -1 // the last job whose statements stand
	for p := len(r.at) - 1; p > pending[0].pos; p-- {
		if c := r.at[p]; c != nil && c.statements > 0 && (!c.done() || c.err == nil) {
			last = p
			break
		}
	}
	n := 0
	for n < len(pending) && pending[n].pos < last {
		n++
	}
	return n
}

// unsend resets jobs whose first statement was rolled back (or, after a
// statement that failed before it in the pipeline, did not run): they wait
// for the next wave, their first statement pending again.
func (r *runner) unsend(jobs []*coroutine) {
	for _, d := range jobs {
		d.statements, d.savepoint, d.spSeq, d.lastSeq = 0, "", 0, 0
	}
}

// aborted reports whether the transaction is in a failed state (a
// statement of the last round trip failed): only a rollback can run.
func (r *runner) aborted() bool {
	return r.tx.Conn().PgConn().TxStatus() == 'E'
}

// flushRollback runs the rollback left for the next round trip
// (r.rollback) on its own, when no wave will carry it.
func (r *runner) flushRollback() error {
	if r.rollback == "" {
		return nil
	}
	sp := r.rollback
	r.rollback = ""
	if _, err := r.tx.Exec(context.WithoutCancel(r.ctx), "ROLLBACK TO SAVEPOINT "+sp); err != nil {
		return fmt.Errorf("rolling back the rest of a wave: %w", err)
	}
	return nil
}

// savepointName is the savepoint of the job at pos, the same in every wave
// the job is sent in. A job sent again was rolled back to its own
// savepoint or to an earlier one; a ROLLBACK TO SAVEPOINT always means the
// newest savepoint of that name, which PostgreSQL keeps when one of the
// same name is established again ("the old savepoint is kept, though only
// the more recent one will be used when rolling back or releasing",
// https://www.postgresql.org/docs/15/sql-savepoint.html): the one of the
// job's latest sending, the one meant. What makes that so: a job is sent
// again only after a rollback to its savepoint or an earlier one (a cut, a
// failure, a restart), which destroys every savepoint established after
// that one, and the jobs are first sent in order; so the newest r<p> is
// the one of the job at p as it last started.
// Positions, not waves, name them so that a transaction's savepoint
// statements are at most one per job position: the worker's connections
// cache every statement they prepare (pgx's statement cache,
// internal/database), and a name per wave made each new one cost a round
// trip of its own to prepare it, and pushed the handlers' statements out
// of the cache (issue 24).
func savepointName(pos int) string { return "r" + strconv.Itoa(pos) }

// send sends, in one round trip, the pending call of each job of all: the
// first heads are pending jobs (their next statement, no savepoint), the
// first bounded of them with their lock waits bounded (outOfOrder), the
// others jobs whose first statement this is, each after its savepoint when
// it has one. It stores the replies in the calls, and returns how many of
// them ran: the statements after one that failed did not (the server skips
// the rest of the pipeline). A lone Query runs directly after its
// savepoint, since its rows are read while the job resumes. A rollback a
// cut or a restart left (r.rollback) goes first: in the same round trip,
// or alone before it for a lone Query or in an aborted transaction.
func (r *runner) send(all []*coroutine, heads, bounded int) (int, error) {
	if heads == 0 && len(all) == 1 && all[0].pending.kind == queryCall {
		if err := r.flushRollback(); err != nil {
			return 0, err
		}
		c := all[0] // the first of its wave: it has its savepoint
		if _, err := r.tx.Exec(r.ctx, "SAVEPOINT "+c.savepoint); err != nil {
			return 0, fmt.Errorf("savepoint: %w", err)
		}
		r.seq++
		c.spSeq = r.seq
		c.pending.runOn(r.tx)
		r.ran(c)
		return 1, nil
	}
	if r.aborted() {
		// pgx forgets every statement of a round trip in which one
		// failed (it invalidates them in its statement cache) and
		// prepares the statements it does not hold in a round trip of
		// its own before the batch, which an aborted transaction refuses:
		// the rollback goes first, alone.
		if err := r.flushRollback(); err != nil {
			return 0, err
		}
	}
	b := &pgx.Batch{}
	rollback := r.rollback
	r.rollback = ""
	if rollback != "" {
		b.Queue("ROLLBACK TO SAVEPOINT " + rollback)
	}
	if bounded > 0 {
		b.Queue(saveLockTimeout)
		b.Queue(setLockTimeout, strconv.FormatInt(max(1, r.classes.LockWait.Milliseconds()), 10)+"ms")
	}
	for k, c := range all {
		if k == bounded && bounded > 0 {
			b.Queue(restoreLockTimeout)
		}
		if k >= heads && c.savepoint != "" {
			b.Queue("SAVEPOINT " + c.savepoint)
		}
		b.Queue(c.pending.sql, c.pending.args...)
	}
	if bounded == len(all) {
		b.Queue(restoreLockTimeout)
	}
	br := r.tx.SendBatch(r.ctx, b)
	if rollback != "" {
		if _, err := br.Exec(); err != nil {
			br.Close()
			return 0, fmt.Errorf("rolling back the rest of a wave: %w", err)
		}
	}
	if bounded > 0 {
		for range 2 {
			if _, err := br.Exec(); err != nil {
				br.Close()
				return 0, fmt.Errorf("bounding the lock waits of a wave: %w", err)
			}
		}
	}
	sent, failed := 0, false
	for k, c := range all {
		if k == bounded && bounded > 0 {
			if _, err := br.Exec(); err != nil {
				br.Close()
				return sent, fmt.Errorf("restoring lock_timeout: %w", err)
			}
		}
		if k >= heads && c.savepoint != "" {
			if _, err := br.Exec(); err != nil {
				br.Close()
				return sent, fmt.Errorf("savepoint: %w", err)
			}
			r.seq++
			c.spSeq = r.seq
		}
		c.pending.readFrom(br, r.tx.Conn().TypeMap())
		r.ran(c)
		sent++
		if c.pending.err != nil {
			failed = true
			break
		}
	}
	if bounded == len(all) && !failed {
		if _, err := br.Exec(); err != nil {
			br.Close()
			return sent, fmt.Errorf("restoring lock_timeout: %w", err)
		}
	}
	if err := br.Close(); err != nil && !failed {
		return sent, err
	}
	return sent, nil
}

// The statements that bound the lock waits of the pending jobs' statements
// of a wave (Classes.LockWait): the transaction's lock_timeout is kept in
// a setting of the transaction's own (a custom one: any role may set it),
// set to the bound for those statements, and set back after them. Should
// one of them fail, the rollback that undoes its job goes to a savepoint
// from before the wave, which undoes the settings too (a savepoint "allows
// all commands that are executed after it was established to be rolled
// back, restoring the transaction state to what it was at the time of the
// savepoint", https://www.postgresql.org/docs/15/sql-savepoint.html;
// TestAnInterleavedStatementWaitsForALockAtMostLockWait checks it).
const (
	saveLockTimeout    = "SELECT set_config('inbox_batch.lock_timeout', current_setting('lock_timeout'), true)"
	setLockTimeout     = "SELECT set_config('lock_timeout', $1, true)"
	restoreLockTimeout = "SELECT set_config('lock_timeout', current_setting('inbox_batch.lock_timeout'), true)"
)

// Shapes learns, per class of job, how many statements its jobs usually
// make (expect) and whether they always made one and never failed
// (steady): RunClasses sends no job that conflicts with a job of such a
// class after it in its wave, and leaves out savepoints. Several
// Runs may share one (the worker's drainers do). A class seen for the
// first time is taken to make one.
type Shapes struct {
	mu sync.Mutex
	m  map[string]*shape
}

type shape struct{ jobs, several, many, failed int }

// shapeMemory bounds what a class remembers: past it, the counts are
// halved, so a class whose jobs change shape is followed.
const shapeMemory = 1000

// expect is how many statements a job of class is expected to make: 2
// when most jobs of the class made more than one, 3 when most made more
// than two, else 1 (a class seen for the first time too).
func (s *Shapes) expect(class string) int {
	if s == nil || class == "" {
		return 1
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sh := s.m[class]
	switch {
	case sh == nil:
		return 1
	case 2*sh.many > sh.jobs:
		return 3
	case 2*sh.several > sh.jobs:
		return 2
	}
	return 1
}

// steadyAfter is how many jobs of a class must have run before it is
// known to be steady.
const steadyAfter = 8

// steady reports whether every job of class that ran (at least
// steadyAfter, within shapeMemory) made one statement (oneStatement), and
// whether none of them failed after a statement (neverFails): RunClasses
// sends a job without a savepoint of its own between two such jobs.
func (s *Shapes) steady(class string) (oneStatement, neverFails bool) {
	if s == nil || class == "" {
		return false, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sh := s.m[class]
	if sh == nil || sh.jobs < steadyAfter {
		return false, false
	}
	return sh.several == 0, sh.failed == 0
}

func (s *Shapes) record(class string, statements int, failed bool) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]*shape{}
	}
	sh := s.m[class]
	if sh == nil {
		sh = &shape{}
		s.m[class] = sh
	}
	sh.jobs++
	if statements > 1 {
		sh.several++
	}
	if statements > 2 {
		sh.many++
	}
	if failed {
		sh.failed++
	}
	if sh.jobs >= shapeMemory {
		sh.jobs, sh.several, sh.many, sh.failed = sh.jobs/2, sh.several/2, sh.many/2, sh.failed/2
	}
}
