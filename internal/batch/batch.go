// Package batch runs several jobs in one PostgreSQL transaction, each
// undone alone when it fails (a savepoint of its own, or a restart; see
// below), and sends the first statement of many jobs in one round trip. It
// is what makes the worker's batches cheap where a round trip is expensive
// (through RDS Proxy about 1 ms): a batch of 50 receipts whose handlers
// need one statement each costs one round trip, not 100.
//
// Design. Each job is plain sequential code written against DB; Run runs it
// as a coroutine (iter.Pull), so every call it makes suspends it and hands
// the call to Run. Run takes jobs in order into waves: a wave is one
// pipeline that carries, for every job in it, a SAVEPOINT named after the
// job's position (r<position>; left out for some jobs of steady classes,
// below) followed by the job's pending call. The
// replies are handed to the jobs in order. A job that wants a further
// statement cuts the wave: the jobs after it are rolled back to the
// savepoint of the first of them and wait for the next wave. Its next
// statement heads the next wave, sent after that rollback and before those
// jobs again (unless it is a Query: then the rollback goes alone, and the
// Query after it); a job at the head of a wave that wants yet another
// statement cuts that wave too, and then finishes alone, its next
// statement in the round trip of the rollback, then one round trip per
// statement. So a job's statements always run together, directly after
// its savepoint, and nothing is applied twice. A job that fails is rolled
// back to its savepoint (with the jobs after it, which go again in the
// next wave). The wave size halves
// after a wave that sent jobs again and doubles after a wave without one,
// so when most jobs need several statements the waves shrink to one job
// and little is sent twice.
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
// while the wave went on past it, or the job fail, the rollback needed is
// to a savepoint left out (a job at the end of its wave that wants another
// statement sends it at the head of the next wave, whose first job has its
// savepoint: no rollback is needed). The run then rolls back to the
// savepoint before it (in the next round trip), stops the jobs from there
// and starts them again, each under its own savepoint, for the rest of the
// run (restartAt).
// Those jobs' statements run twice, the first time undone, and so they
// count once: a job's effect is what its last run left, which is why a
// Job must keep nothing outside the transaction but what its last run
// leaves. A job that failed is not started again: it stands failed, its
// statements undone with the restart (a deadlock or a lock timeout would
// otherwise be waited for twice).
//
// Jobs of a class that usually needs several statements (RunClasses:
// Shapes learns it from the jobs that ran, say a pre-basil charge.refunded,
// which links its charge to the invoice before it books its refunds) end
// the wave they are in: the wave is sent up to and with such a job. In a
// mix where one job in ten is of such a class, cutting the wave at it
// instead sends most jobs two or three times (issue 24). A job that ends
// its wave (the last one sent) and wants a second statement sends it at
// the head of the next wave, before the savepoints and first statements of
// the jobs after it, so its statements still run together, and a job of
// two statements costs no round trip of its own; when its class usually
// wants more than two, it finishes alone instead, one round trip per
// statement (a third statement wanted at the head of a wave cuts that wave).
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
	"strconv"
	"sync"

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
// not a count it adds to).
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
	Of     []string
	Shapes *Shapes
}

// RunClasses is Run, learning in c.Shapes how many statements the jobs of
// each class make and ending a wave at a job whose class usually makes
// several (see the package comment). Which jobs end a wave changes only the
// round trips, never what is applied.
func RunClasses(ctx context.Context, tx Tx, jobs []Job, c Classes, more func() bool) (int, []error, error) {
	r := &runner{ctx: ctx, tx: tx, errs: make([]error, 0, len(jobs)), classes: c, fewer: c.Shapes != nil,
		failedPos: -1, recorded: make([]bool, len(jobs))}
	defer func() {
		for _, c := range r.started {
			c.stop()
		}
	}()
	var (
		queue []*coroutine // started jobs waiting on their first statement
		carry *coroutine   // the last wave's last job, waiting on its second statement
	)
	size := len(jobs)
	for {
		for len(queue) < size && len(r.errs) < len(jobs) && (len(r.errs) == 0 || len(r.errs) == r.failedPos || more == nil || more()) {
			if len(r.errs) == r.failedPos {
				// It failed before the restart: not run again, and
				// reported failed whatever more says now.
				r.errs = append(r.errs, r.failedErr)
				continue
			}
			c := r.start(jobs[len(r.errs)])
			if c.done() {
				r.errs[c.pos] = c.err // no statement ran: nothing to roll back
				continue
			}
			queue = append(queue, c)
		}
		var err error
		if carry != nil {
			// As for any call: one whose context is done is not sent.
			carry.skipDone()
			if carry.done() {
				err = r.flushRollback()
				if err == nil {
					err = r.finishCarried(carry)
				}
				carry = nil
			}
		}
		if err == nil {
			if len(queue) == 0 && carry == nil {
				break
			}
			n := 0
			for n < min(len(queue), size) && queue[n].pending.kind != queryCall {
				n++
				if queue[n-1].several {
					break // its second statement heads the next wave
				}
			}
			wave := queue[:n]
			switch {
			case carry == nil:
				wave = queue[:max(n, 1)] // a Query goes alone
			case carry.pending.kind == queryCall:
				wave = nil // a carried job's Query too (after a call skipDone answered)
			}
			var (
				consumed int
				cut      bool
				next     *coroutine
			)
			consumed, cut, next, err = r.runWave(carry, wave)
			if err == nil {
				queue, carry = queue[consumed:], next
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
		// A rollback needed a savepoint the run left out (fewer): the
		// jobs from the one before it on run again, each under a
		// savepoint of its own.
		queue, carry = nil, nil
	}
	// A restart whose jobs then sent nothing (their context done) still
	// undoes what they did before it.
	if err := r.flushRollback(); err != nil {
		return len(r.errs), r.errs, err
	}
	return len(r.errs), r.errs, nil
}

// runner is one Run in progress.
type runner struct {
	ctx     context.Context
	tx      Tx
	classes Classes
	// rollback is a savepoint the next round trip first rolls back to
	// ("" when none): that of the first of the jobs after a job that cut
	// its wave and carries its second statement to the next one.
	rollback string
	errs     []error      // one per job started, in order
	started  []*coroutine // every job started, stopped when Run returns
	// fewer: a job of a class known never to fail, after a job of a class
	// known to take one statement, is sent without a savepoint of its own
	// (savepoints); true until a rollback needs a savepoint so left out
	// (restartAt), then every job has its own.
	fewer bool
	// failedPos is the job whose failure restarted the run (-1: none),
	// failedErr its error: it is not run again (a job that hit a deadlock or
	// a lock timeout would wait on the same lock again, with the
	// transaction's locks held); it stands failed, rolled back with the
	// restart.
	failedPos int
	failedErr error
	// recorded: the jobs Shapes has counted, by position, so that a job
	// started again after a restart counts once.
	recorded []bool
}

// errRestart: a rollback needed a savepoint that was left out; the run
// goes on from the job of the savepoint before it (restartAt).
var errRestart = errors.New("batch: restart from an earlier savepoint")

// savepoints decides which jobs of wave are sent after a savepoint of
// their own. Every job is, unless fewer: then the first of the wave is, and
// a job after it only when the one before it may want a further statement
// (its class is not known to take one: a cut rolls back to the savepoint
// of the job after the one that cut) or it may fail (its class is not
// known never to: a failure rolls back to the job's own savepoint). A
// rollback whose savepoint was left out all the same (a job of a class
// known to take one statement took two, or one known never to fail failed)
// restarts the run from the savepoint before it (restartAt).
func (r *runner) savepoints(wave []*coroutine) {
	for i, c := range wave {
		c.savepoint = savepointName(c.pos)
		if r.fewer && i > 0 {
			if oneBefore, _ := r.classes.Shapes.steady(r.class(wave[i-1].pos)); oneBefore {
				if _, neverFails := r.classes.Shapes.steady(r.class(c.pos)); neverFails {
					c.savepoint = ""
				}
			}
		}
	}
}

// savepointFor is the savepoint to roll back to for the job c and those
// after it: its own, or, when it was left out, errRestart after restartAt.
// failed is c's error when c failed (it is then not run again), nil for a
// cut.
func (r *runner) savepointFor(c *coroutine, failed error) (string, error) {
	if c.savepoint != "" {
		return c.savepoint, nil
	}
	if failed != nil {
		r.failedPos, r.failedErr = c.pos, failed
		r.settle(c) // Shapes learns that its class fails
	}
	return "", r.restartAt(c.pos)
}

// restartAt rolls back (with the next round trip) to the latest savepoint
// at or before the job at pos, and starts the jobs from there again, each
// under a savepoint of its own. What those jobs did is undone with the
// rollback; their coroutines are stopped first (a job stopped mid-way gets
// errAbandoned from its call and returns), so nothing of theirs is left
// to run beside the new ones. Returns errRestart.
func (r *runner) restartAt(pos int) error {
	from := -1
	for _, c := range r.started {
		if c.pos <= pos && c.savepoint != "" {
			from = max(from, c.pos)
		}
	}
	if from < 0 {
		return fmt.Errorf("batch: no savepoint at or before job %d", pos) // every wave's first job has one
	}
	for _, c := range r.started {
		if c.pos >= from {
			c.stop()
		}
	}
	r.rollback = savepointName(from)
	r.errs = r.errs[:from]
	r.fewer = false
	return errRestart
}

// class is the class of the job at pos ("" when none was given).
func (r *runner) class(pos int) string {
	if pos < len(r.classes.Of) {
		return r.classes.Of[pos]
	}
	return ""
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
	c.several, c.many = r.classes.Shapes.shape(r.class(c.pos))
	r.errs = append(r.errs, nil)
	r.started = append(r.started, c)
	c.skipDone()
	return c
}

// finishCarried settles a carried job that returned without sending its
// second statement: rolled back to its savepoint when it failed (nothing
// ran after it).
func (r *runner) finishCarried(c *coroutine) error {
	if c.err != nil {
		sp, err := r.savepointFor(c, c.err)
		if err != nil {
			return err
		}
		if _, err := r.tx.Exec(context.WithoutCancel(r.ctx), "ROLLBACK TO SAVEPOINT "+sp); err != nil {
			return fmt.Errorf("%w (and rolling back to the savepoint: %v)", c.err, err)
		}
	}
	r.errs[c.pos] = c.err
	r.settle(c)
	return nil
}

// runWave sends the wave, headed by the second statement of head (the last
// job of the wave before, when it wanted one; nil when none), and hands the
// replies to its jobs in order. It returns how many jobs of wave it
// consumed (settled, or carried: the rest wait, their first statement
// pending, for the next wave), whether the wave was cut short (jobs of it
// were rolled back, to be sent again), and the job, if any, whose second
// statement heads the next wave (carry).
func (r *runner) runWave(head *coroutine, wave []*coroutine) (consumed int, cut bool, carry *coroutine, err error) {
	r.savepoints(wave)
	all, off := wave, 0 // off: where wave starts in all
	if head != nil {
		all, off = append([]*coroutine{head}, wave...), 1
	}
	sent, err := r.send(all, head != nil)
	if err != nil {
		return 0, false, nil, err
	}
	for k, c := range all[:sent] {
		c.resume()
		c.skipDone()
		if !c.done() {
			if k+1 == len(all) && sent == len(all) && c.carries() {
				// The last of the wave wants its second statement: it
				// heads the next wave, with nothing after it here to undo.
				return k + 1 - off, cut, c, nil
			}
			if k+1 < sent && c.carries() {
				// It cut the wave and wants its second statement: the next
				// wave first undoes the jobs after it (rolling back to the
				// first one's savepoint), then sends its statement, then
				// those jobs again; its statements still run together.
				sp, err := r.savepointFor(all[k+1], nil)
				if err != nil {
					return 0, false, nil, err
				}
				r.rollback = sp
				for _, d := range all[k+1 : sent] {
					d.statements = 0 // rolled back: sent again from the start
				}
				return k + 1 - off, true, c, nil
			}
			// It wants another statement: undo the statements of the jobs
			// after it, and let it finish alone, its next statement in
			// the round trip of the rollback.
			if k+1 < sent {
				cut = true
				sp, err := r.savepointFor(all[k+1], nil)
				if err != nil {
					return 0, false, nil, err
				}
				if err := r.rollbackThen(sp, c); err != nil {
					return 0, false, nil, err
				}
			}
			for !c.done() {
				c.pending.runOn(r.tx)
				c.statements++
				c.resume()
				c.skipDone()
			}
		}
		if c.err != nil {
			// Rolling back to its savepoint undoes the jobs after it.
			cut = cut || k+1 < sent
			sp, err := r.savepointFor(c, c.err)
			if err != nil {
				return 0, false, nil, err
			}
			if _, err := r.tx.Exec(context.WithoutCancel(r.ctx), "ROLLBACK TO SAVEPOINT "+sp); err != nil {
				return 0, false, nil, fmt.Errorf("%w (and rolling back to the savepoint: %v)", c.err, err)
			}
		}
		r.errs[c.pos] = c.err
		r.settle(c)
		if cut {
			for _, d := range all[k+1 : sent] {
				d.statements = 0 // rolled back: sent again from the start
			}
			return k + 1 - off, true, nil, nil
		}
	}
	return sent - off, sent < len(all), nil, nil
}

// aborted reports whether the transaction is in a failed state (a
// statement of the last round trip failed): only a rollback can run.
func (r *runner) aborted() bool {
	return r.tx.Conn().PgConn().TxStatus() == 'E'
}

// flushRollback runs the rollback a carried job left for the next round
// trip (r.rollback) on its own: the carried job's next call will not be
// sent with it (it returned, or its call is a Query).
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

// rollbackThen rolls back to savepoint sp (the jobs after c in its wave)
// and sends c's pending call in the same round trip (send, as the head of
// a wave of its own: alone after the rollback when it is a Query or the
// transaction is aborted), then resumes c with the reply.
func (r *runner) rollbackThen(sp string, c *coroutine) error {
	r.rollback = sp
	if _, err := r.send([]*coroutine{c}, true); err != nil {
		return err
	}
	c.resume()
	c.skipDone()
	return nil
}

// savepointName is the savepoint of the job at pos, the same in every wave
// the job is sent in. A job sent again was rolled back to its own
// savepoint or to an earlier one; a ROLLBACK TO SAVEPOINT always means the
// newest savepoint of that name, which PostgreSQL keeps when one of the
// same name is established again ("the old savepoint is kept, though only
// the more recent one will be used when rolling back or releasing",
// https://www.postgresql.org/docs/15/sql-savepoint.html): the one of the
// job's latest sending, the one meant. What makes that so: every ROLLBACK
// TO SAVEPOINT r<p> is sent in the wave that established r<p> (or, for a
// carried job, in the round trip right after it; for a restart, at the
// latest savepoint at or before the job that needed one, in the next round
// trip), before any job at or after p is sent again with a new r<p>; a
// statement left inside an older r<p> would otherwise be undone by a
// rollback meant for a newer one.
// Positions, not waves, name them so that a transaction's savepoint
// statements are at most one per job position: the worker's connections
// cache every statement they prepare (pgx's statement cache,
// internal/database), and a name per wave made each new one cost a round
// trip of its own to prepare it, and pushed the handlers' statements out
// of the cache (issue 24).
func savepointName(pos int) string { return "r" + strconv.Itoa(pos) }

// send sends, in one round trip, the pending call of each job of all, each
// after a savepoint of its own but the first when cont (its job's second
// statement, which follows its first), and stores the replies in the
// calls. It returns how many of them ran: the statements after one that
// failed did not (the server skips the rest of the pipeline). A lone Query
// runs directly after its savepoint, since its rows are read while the job
// resumes. A rollback a cut left (r.rollback) goes first: in the same round
// trip, or alone before it for a lone Query or in an aborted transaction.
func (r *runner) send(all []*coroutine, cont bool) (int, error) {
	if len(all) == 1 && all[0].pending.kind == queryCall {
		if err := r.flushRollback(); err != nil {
			return 0, err
		}
		if !cont { // a lone Query is the first of its wave: it has its savepoint
			if _, err := r.tx.Exec(r.ctx, "SAVEPOINT "+all[0].savepoint); err != nil {
				return 0, fmt.Errorf("savepoint: %w", err)
			}
		}
		all[0].pending.runOn(r.tx)
		all[0].statements++
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
	for k, c := range all {
		if (k > 0 || !cont) && c.savepoint != "" {
			b.Queue("SAVEPOINT " + c.savepoint)
		}
		b.Queue(c.pending.sql, c.pending.args...)
	}
	br := r.tx.SendBatch(r.ctx, b)
	if rollback != "" {
		if _, err := br.Exec(); err != nil {
			br.Close()
			return 0, fmt.Errorf("rolling back the rest of a wave: %w", err)
		}
	}
	sent, failed := 0, false
	for k, c := range all {
		if (k > 0 || !cont) && c.savepoint != "" {
			if _, err := br.Exec(); err != nil {
				br.Close()
				return sent, fmt.Errorf("savepoint: %w", err)
			}
		}
		c.pending.readFrom(br, r.tx.Conn().TypeMap())
		c.statements++
		sent++
		if c.pending.err != nil {
			failed = true
			break
		}
	}
	if err := br.Close(); err != nil && !failed {
		return sent, err
	}
	return sent, nil
}

// Shapes learns, per class of job, whether its jobs usually make more than
// one statement: RunClasses ends a wave at a job of such a class. Several
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

// shape reports whether most jobs of class made more than one statement
// (several), and whether most made more than two (many).
func (s *Shapes) shape(class string) (several, many bool) {
	if s == nil || class == "" {
		return false, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sh := s.m[class]
	if sh == nil {
		return false, false
	}
	return 2*sh.several > sh.jobs, 2*sh.many > sh.jobs
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
