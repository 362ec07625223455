package worker

import (
	"context"
	"errors"
	"iter"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/stripe-inbox/inbox/internal/handlers"
)

// In a batch, each receipt's handler runs as a coroutine (iter.Pull): every
// database call it makes suspends it and hands the call to the batch, which
// decides when and how to run it. That lets the batch send the first
// statement of many handlers in one round trip (see batch.go) while handlers
// stay plain sequential code written against handlers.DB.

type callKind int

const (
	execCall callKind = iota
	queryRowCall
	queryCall
)

// dbCall is one database call of a handler, and its reply.
type dbCall struct {
	kind callKind
	sql  string
	args []any

	tag  pgconn.CommandTag
	row  pgx.Row
	rows pgx.Rows
	err  error
}

// errAbandoned is what a handler's pending call returns when the batch gives
// up on the handler (its transaction failed).
var errAbandoned = errors.New("the batch abandoned this handler run")

// handlerRun is one receipt's handler in progress.
type handlerRun struct {
	next func() (*dbCall, bool)
	stop func()
	// pending is the call the handler is suspended on; nil once it returned.
	pending *dbCall
	res     handlers.Result
	err     error
	// statements counts the calls the batch has run for it.
	statements int
}

// startHandler runs the handler for ev until its first database call (or its
// return).
func startHandler(ctx context.Context, reg handlers.Registry, ev handlers.Event) *handlerRun {
	r := &handlerRun{}
	r.next, r.stop = iter.Pull(func(yield func(*dbCall) bool) {
		r.res, r.err = applyHandler(ctx, reg, &yieldDB{yield: yield}, ev)
	})
	r.resume()
	return r
}

// resume gives the handler the reply to its pending call (already stored in
// it) and runs it until its next call or its return.
func (r *handlerRun) resume() {
	call, ok := r.next()
	if !ok {
		call = nil
	}
	r.pending = call
}

func (r *handlerRun) done() bool { return r.pending == nil }

// yieldDB is the handlers.DB a coroutine sees.
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

func (d *yieldDB) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c := d.call(&dbCall{kind: execCall, sql: sql, args: args})
	return c.tag, c.err
}

func (d *yieldDB) QueryRow(_ context.Context, sql string, args ...any) pgx.Row {
	c := d.call(&dbCall{kind: queryRowCall, sql: sql, args: args})
	if c.err != nil {
		return errRow{c.err}
	}
	return c.row
}

func (d *yieldDB) Query(_ context.Context, sql string, args ...any) (pgx.Rows, error) {
	c := d.call(&dbCall{kind: queryCall, sql: sql, args: args})
	return c.rows, c.err
}

// runDirect runs c on tx and stores the reply. A row or rows it returns are
// read by the handler when it resumes, before it makes its next call.
func runDirect(ctx context.Context, tx pgx.Tx, c *dbCall) {
	switch c.kind {
	case execCall:
		c.tag, c.err = tx.Exec(ctx, c.sql, c.args...)
	case queryRowCall:
		c.row = tx.QueryRow(ctx, c.sql, c.args...)
	case queryCall:
		c.rows, c.err = tx.Query(ctx, c.sql, c.args...)
	}
}

// readResult reads c's result, the next one of br, into c. A row is copied
// out, since the next result of br replaces it.
func readResult(br pgx.BatchResults, typeMap *pgtype.Map, c *dbCall) {
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
