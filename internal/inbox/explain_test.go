package inbox

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// ExplainClaim returns the plan of the claim p describes, as EXPLAIN
// (ANALYZE, BUFFERS, FORMAT format) prints it (format TEXT or JSON), for
// the tests (scripts/bench has its own: internal/benchsql). ANALYZE runs
// the claim: it does so in a transaction that it rolls back.
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
	rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT "+format+") "+claimReceipts, p.Now, p.MaxAttempts, p.Limit, p.Lease.Milliseconds())
	if err != nil {
		return "", fmt.Errorf("explaining the claim: %w", err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "", fmt.Errorf("explaining the claim: %w", err)
	}
	return strings.Join(lines, "\n"), nil
}
