package inbox

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// explained numbers ExplainClaim's prepared statements.
var explained atomic.Int64

// ExplainClaim returns the plan of the claim p describes, as EXPLAIN
// (ANALYZE, BUFFERS, FORMAT format) prints it (format TEXT or JSON), for
// the tests (scripts/bench has its own: internal/benchsql). The plan is the
// one the worker's connections run: the claim prepared, after what its
// transaction sets for itself (claimLocals: a generic plan), and executed.
// ANALYZE runs the claim: it does so in a transaction that it rolls back.
func ExplainClaim(ctx context.Context, db interface {
	Begin(context.Context) (pgx.Tx, error)
}, p ClaimParams, format string) (string, error) {
	if format != "TEXT" && format != "JSON" {
		return "", fmt.Errorf("explaining the claim: format %q is not TEXT or JSON", format)
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return "", fmt.Errorf("explaining the claim: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // the claim must not stay
	for _, q := range claimLocals(0) {
		if _, err := tx.Exec(ctx, q.sql, q.args...); err != nil {
			return "", fmt.Errorf("explaining the claim: %w", err)
		}
	}
	// A prepared statement outlives the transaction: deallocated below,
	// and named once per call, so that one an error left on a pooled
	// connection never collides with the next.
	name := fmt.Sprintf("explained_claim_%d", explained.Add(1))
	if _, err := tx.Exec(ctx, "PREPARE "+name+" AS "+claimSQL(p.Limit)); err != nil {
		return "", fmt.Errorf("explaining the claim: %w", err)
	}
	// EXECUTE's parameters take no $n: sent as literals.
	rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT "+format+") EXECUTE "+name+"($1, $2, $3)",
		pgx.QueryExecModeSimpleProtocol, p.Now, p.MaxAttempts, p.Lease.Milliseconds())
	if err != nil {
		return "", fmt.Errorf("explaining the claim: %w", err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "", fmt.Errorf("explaining the claim: %w", err)
	}
	if _, err := tx.Exec(ctx, "DEALLOCATE "+name); err != nil {
		return "", fmt.Errorf("explaining the claim: %w", err)
	}
	return strings.Join(lines, "\n"), nil
}
