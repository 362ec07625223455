package batch

import (
	"context"
	"errors"
	"iter"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// A job runs as a coroutine: each call it makes on DB suspends it and hands
// the call (a dbCall) to Run, which runs it (in a pipeline or alone), stores
// the reply in it and resumes the job.

type callKind int

const (
	execCall callKind = iota
	queryRowCall
	queryCall
)

// dbCall is one database call of a job, and its reply.
type dbCall struct {
	ctx  context.Context // the job's context for this call
	kind callKind
	sql  string
	args []any

	tag  pgconn.CommandTag
	row  pgx.Row
	rows pgx.Rows
	err  error
}

// errAbandoned is what a job's pending call returns when Run gives up on the
// job: the transaction failed, or the job's statements were rolled back to
// start it again (restartAt).
var errAbandoned = errors.New("batch: the transaction failed before this call ran, or the job is started again")

// coroutine is one job in progress.
type coroutine struct {
	pos       int    // the job's index in Run's jobs
	savepoint string // its own (r<pos>) when the wave that sent its first statement had one for it, else ""
	next      func() (*dbCall, bool)
	stop      func()
	// pending is the call the job is suspended on; nil once it returned.
	pending *dbCall
	err     error // what the job returned
	// statements counts the calls Run has sent for it that stand (not
	// rolled back with the rest of a wave).
	statements int
	// expect is how many statements it is expected to make (Shapes.expect,
	// raised when it wants more than that).
	expect int
	// spSeq and lastSeq number its savepoint and its latest statement
	// among the statements of the run (runner.seq).
	spSeq, lastSeq int
}

// blocks reports whether the job may want a further statement after its
// next n: until then, no job it conflicts with may be sent.
func (c *coroutine) blocks(n int) bool {
	return c.statements+n < c.expect
}

// startJob runs job until its first call (or its return).
func startJob(ctx context.Context, pos int, job Job) *coroutine {
	c := &coroutine{pos: pos}
	c.next, c.stop = iter.Pull(func(yield func(*dbCall) bool) {
		c.err = job(ctx, &yieldDB{yield: yield})
	})
	c.resume()
	return c
}

// resume gives the job the reply to its pending call (already stored in it)
// and runs it until its next call or its return.
func (c *coroutine) resume() {
	call, ok := c.next()
	if !ok {
		call = nil
	}
	c.pending = call
}

// skipDone answers pending calls whose context is done with the context's
// error, without sending them, until the job makes a call that can be sent
// or returns (as pgx does with a context that is done before a statement).
func (c *coroutine) skipDone() {
	for c.pending != nil && c.pending.ctx.Err() != nil {
		c.pending.err = c.pending.ctx.Err()
		c.resume()
	}
}

func (c *coroutine) done() bool { return c.pending == nil }

// yieldDB is the DB a job sees.
type yieldDB struct {
	yield     func(*dbCall) bool
	abandoned bool
}

func (d *yieldDB) call(c *dbCall) *dbCall {
	if d.abandoned || !d.yield(c) {
		d.abandoned = true
		c.err = errAbandoned
	}
	return c
}

func (d *yieldDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c := d.call(&dbCall{ctx: ctx, kind: execCall, sql: sql, args: args})
	return c.tag, c.err
}

func (d *yieldDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	c := d.call(&dbCall{ctx: ctx, kind: queryRowCall, sql: sql, args: args})
	if c.err != nil {
		return errRow{c.err}
	}
	return c.row
}

func (d *yieldDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	c := d.call(&dbCall{ctx: ctx, kind: queryCall, sql: sql, args: args})
	return c.rows, c.err
}

// runOn runs c alone on tx, under c's context, and stores the reply. A row
// or rows it returns are read by the job when it resumes, before its next
// call.
func (c *dbCall) runOn(tx DB) {
	switch c.kind {
	case execCall:
		c.tag, c.err = tx.Exec(c.ctx, c.sql, c.args...)
	case queryRowCall:
		c.row = tx.QueryRow(c.ctx, c.sql, c.args...)
	case queryCall:
		c.rows, c.err = tx.Query(c.ctx, c.sql, c.args...)
	}
}

// readFrom reads c's result, the next one of br, into c. A row is copied
// out, since the next result of br replaces it.
func (c *dbCall) readFrom(br pgx.BatchResults, typeMap *pgtype.Map) {
	c.tag, c.row, c.rows, c.err = pgconn.CommandTag{}, nil, nil, nil
	if c.kind == execCall {
		c.tag, c.err = br.Exec()
		return
	}
	rows, err := br.Query()
	if err != nil {
		c.err = err
		return
	}
	row := bufferedRow{typeMap: typeMap}
	if rows.Next() {
		row.found = true
		row.fields = append([]pgconn.FieldDescription(nil), rows.FieldDescriptions()...)
		for _, v := range rows.RawValues() {
			if v != nil {
				v = append([]byte{}, v...)
			}
			row.values = append(row.values, v)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		c.err = err
		return
	}
	c.row = row
}

// bufferedRow is a row read ahead of its Scan.
type bufferedRow struct {
	typeMap *pgtype.Map
	found   bool
	fields  []pgconn.FieldDescription
	values  [][]byte
}

func (r bufferedRow) Scan(dest ...any) error {
	if !r.found {
		return pgx.ErrNoRows
	}
	return pgx.ScanRow(r.typeMap, r.fields, r.values, dest...)
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }
