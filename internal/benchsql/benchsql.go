// Package benchsql is test support for scripts/bench: the exact statements
// the webhook and the worker run, for the bench to hand to pgbench, so that
// each benchmark's limit runs the application's own SQL (with pgbench
// variables in place of the $n parameters).
//
// No package exports its SQL for this: each statement is captured by calling
// the package's own function (inbox.Store, inbox.Claim, the invoice.paid
// handler, ...) on a stand-in connection that records the first statement
// sent to it and fails it. So the SQL stays in its table's package, and what
// the bench runs cannot drift from it. ExplainClaim also serves
// internal/inbox's claim tests, so that the plan they check is the one the
// bench prints. Production code never imports this package
// (TestProductionNeverImportsIt).
package benchsql

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/stripeevent"
	"github.com/stripe-inbox/inbox/internal/stripetest"
)

// The statements, each with the parameters the function it comes from
// documents in its package's queries.go.
var (
	// StoreSQL is the webhook's INSERT of a receipt (inbox.Store).
	StoreSQL = capture("inbox.Store", func(db *recorder) error {
		_, err := inbox.Store(context.Background(), db, "billing", stripeevent.Event{ID: "evt_capture", Type: "invoice.paid", Payload: []byte(`{}`)})
		return err
	}).sql
	claimPipeline = captureAll("inbox.Claim", 2, func(db *recorder) error {
		_, err := inbox.Claim(context.Background(), db, inbox.ClaimParams{MaxAttempts: 1, Limit: 1, Lease: time.Minute})
		return err
	})
	// ClaimLocalsSQL is what the claim's transaction sets for itself before
	// the claim, in the same pipeline (synchronous_commit off and a generic
	// plan; see inbox.Claim), and ClaimSQL the worker's claim (inbox.Claim)
	// of one receipt (its limit is in its text).
	ClaimLocalsSQL, ClaimSQL = claimPipeline[0].sql, claimPipeline[1].sql
	// SetLocalStatementTimeoutSQL bounds the statements of a processing
	// transaction (inbox.SetLocalStatementTimeout).
	SetLocalStatementTimeoutSQL = capture("inbox.SetLocalStatementTimeout", func(db *recorder) error {
		return inbox.SetLocalStatementTimeout(context.Background(), db, time.Second)
	}).sql
	// LockSQL locks one receipt for processing (inbox.Lock).
	LockSQL = capture("inbox.Lock", func(db *recorder) error {
		_, _, err := inbox.Lock(context.Background(), db, inbox.Key{Provider: inbox.ProviderStripe, Endpoint: "billing", EventID: "evt_capture"})
		return err
	}).sql
	// MarkProcessedSQL marks one receipt processed (inbox.MarkProcessed).
	MarkProcessedSQL = capture("inbox.MarkProcessed", func(db *recorder) error {
		_, err := inbox.MarkProcessed(context.Background(), db, inbox.Key{Provider: inbox.ProviderStripe, Endpoint: "billing", EventID: "evt_capture"}, "applied", nil)
		return err
	}).sql

	payInvoice = capture("the invoice.paid handler", func(db *recorder) error {
		_, err := handlers.Default().Apply(context.Background(), db, handlers.Event{ID: "evt_capture", Type: "invoice.paid", Endpoint: "billing",
			Payload: stripetest.Event("evt_capture", "invoice.paid", stripetest.Invoice("in_capture", "cus_1", "paid", 1000))})
		return err
	})
	// PayInvoiceSQL is invoice.paid's one statement in the common case,
	// for an invoice that names no payment as the bench's receipts, with
	// write-backs off (internal/handlers payInvoiceSQL).
	PayInvoiceSQL = payInvoice.sql
	// PaidFrom is the array literal of the states invoice.paid moves an
	// invoice from (its $7), and PaidRank the rank of status paid (its $9).
	PaidFrom = arrayLiteral(payInvoice.arg(7))
	PaidRank = rank(payInvoice.arg(9))
)

// ExplainClaim returns the plan of the worker's claim with p's
// parameters, as EXPLAIN (ANALYZE, BUFFERS, FORMAT format) prints it
// (format TEXT or JSON): the statements and arguments inbox.Claim sends,
// captured. The plan is the one the worker's connections run: the claim
// prepared, after what its transaction sets for itself (a generic plan),
// and executed. ANALYZE runs the claim: it does so in a transaction that
// it rolls back.
func ExplainClaim(ctx context.Context, db interface {
	Begin(context.Context) (pgx.Tx, error)
}, p inbox.ClaimParams, format string) (string, error) {
	if format != "TEXT" && format != "JSON" {
		return "", fmt.Errorf("explaining the claim: format %q is not TEXT or JSON", format)
	}
	p.StatementTimeout = 0 // the claim and its locals, not a statement_timeout
	all := captureAll("inbox.Claim", 2, func(db *recorder) error {
		_, err := inbox.Claim(ctx, db, p)
		return err
	})
	locals, claim := all[0], all[1]
	tx, err := db.Begin(ctx)
	if err != nil {
		return "", fmt.Errorf("explaining the claim: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // the claim must not stay
	lines, err := explainPrepared(ctx, tx, format, locals, claim)
	if err != nil {
		return "", fmt.Errorf("explaining the claim: %w", err)
	}
	return strings.Join(lines, "\n"), nil
}

// explained numbers explainPrepared's prepared statements.
var explained atomic.Int64

// explainPrepared runs locals, prepares q and explains its execution with
// q's arguments (sent as literals: EXECUTE's parameters take no $n), and
// deallocates it: a prepared statement outlives the transaction. Each is
// named once, so that one an error left on a pooled connection never
// collides with the next.
func explainPrepared(ctx context.Context, tx pgx.Tx, format string, locals, q captured) ([]string, error) {
	if _, err := tx.Exec(ctx, locals.sql, locals.args...); err != nil {
		return nil, err
	}
	name := fmt.Sprintf("benchsql_explained_%d", explained.Add(1))
	if _, err := tx.Exec(ctx, "PREPARE "+name+" AS "+q.sql); err != nil {
		return nil, err
	}
	params := make([]string, len(q.args))
	for i := range params {
		params[i] = fmt.Sprintf("$%d", i+1)
	}
	args := append([]any{pgx.QueryExecModeSimpleProtocol}, q.args...)
	rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT "+format+") EXECUTE "+name+"("+strings.Join(params, ", ")+")", args...)
	if err != nil {
		return nil, err
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	_, err = tx.Exec(ctx, "DEALLOCATE "+name)
	return lines, err
}

// errCaptured fails the statement the recorder captured.
var errCaptured = errors.New("benchsql: statement captured")

// recorder is a connection that records the first statement sent to it
// and fails every statement with errCaptured.
type recorder struct {
	sql  string
	args []any
	n    int
	all  []captured
}

func (r *recorder) record(sql string, args []any) {
	if r.n == 0 {
		r.sql, r.args = sql, args
	}
	r.all = append(r.all, captured{sql: sql, args: args})
	r.n++
}

func (r *recorder) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	r.record(sql, args)
	return pgconn.CommandTag{}, errCaptured
}

func (r *recorder) Query(_ context.Context, sql string, args ...any) (pgx.Rows, error) {
	r.record(sql, args)
	return nil, errCaptured
}

func (r *recorder) QueryRow(_ context.Context, sql string, args ...any) pgx.Row {
	r.record(sql, args)
	return failedRow{}
}

func (r *recorder) SendBatch(_ context.Context, b *pgx.Batch) pgx.BatchResults {
	for _, q := range b.QueuedQueries {
		r.record(q.SQL, q.Arguments)
	}
	return failedBatch{}
}

type failedRow struct{}

func (failedRow) Scan(...any) error { return errCaptured }

// failedBatch fails each result; the methods it does not define are never
// called by the functions captured here.
type failedBatch struct{ pgx.BatchResults }

func (failedBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, errCaptured }
func (failedBatch) Query() (pgx.Rows, error)         { return nil, errCaptured }
func (failedBatch) QueryRow() pgx.Row                { return failedRow{} }
func (failedBatch) Close() error                     { return nil }

// captured is a statement and the arguments it was sent with.
type captured struct {
	what string
	sql  string
	args []any
}

// capture runs f on a recorder and returns the one statement f sent. It
// panics (at the bench's start) when f sent none, or did not stop at the
// recorder's failure: the function no longer starts with a statement.
func capture(what string, f func(*recorder) error) captured {
	r := &recorder{}
	if err := f(r); !errors.Is(err, errCaptured) || r.n != 1 {
		panic(fmt.Sprintf("benchsql: capturing the statement of %s: sent %d statements, returned %v", what, r.n, err))
	}
	return captured{what: what, sql: r.sql, args: r.args}
}

// captureAll runs f on a recorder and returns the n statements f sent in one
// pipeline (SendBatch), in order. It panics as capture does when f sent
// another number of statements.
func captureAll(what string, n int, f func(*recorder) error) []captured {
	r := &recorder{}
	if err := f(r); !errors.Is(err, errCaptured) || r.n != n {
		panic(fmt.Sprintf("benchsql: capturing the statements of %s: sent %d statements (want %d), returned %v", what, r.n, n, err))
	}
	for i := range r.all {
		r.all[i].what = what
	}
	return r.all
}

// arg is the statement's $n.
func (c captured) arg(n int) any {
	if n < 1 || n > len(c.args) {
		panic(fmt.Sprintf("benchsql: %s sent %d arguments, not $%d", c.what, len(c.args), n))
	}
	return c.args[n-1]
}

func arrayLiteral(v any) string {
	s, ok := v.([]string)
	if !ok {
		panic(fmt.Sprintf("benchsql: expected a text array, got %T", v))
	}
	return "{" + strings.Join(s, ",") + "}"
}

func rank(v any) int {
	switch r := v.(type) {
	case int16:
		return int(r)
	case int:
		return r
	}
	panic(fmt.Sprintf("benchsql: expected a rank, got %T", v))
}
