package worker

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/stripe-inbox/inbox/internal/inbox"
)

// The tests drive one receipt's transaction directly, on a connection they
// hold (fixedConn); the drainers reach the same code through drain.

// Process applies one claimed receipt on conn (process) and records the
// outcome. It reports whether the receipt raised an anomaly.
func (w *Worker) Process(ctx context.Context, conn *pgx.Conn, c inbox.Claimed) (Outcome, bool) {
	return w.process(ctx, fixedConn(conn), c)
}

// ProcessBatch applies several claimed receipts in one transaction
// (processBatch) on conn.
func (w *Worker) ProcessBatch(ctx context.Context, conn *pgx.Conn, claimed []inbox.Claimed) ([]Outcome, []bool) {
	return w.processBatch(ctx, fixedConn(conn), claimed)
}

// fixedConn always gives conn.
func fixedConn(conn *pgx.Conn) connSource {
	return func(context.Context) (*pgx.Conn, error) { return conn, nil }
}
