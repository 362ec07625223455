package writeback

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/pgtest"
)

// The backlog (read every minute) counts pending and parked intents through
// their partial indexes, not by reading the table: done intents, almost
// all of it, are never read.
func TestBacklogUsesThePartialIndexes(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `
INSERT INTO writeback_intents (kind, target, params, idempotency_key, event_id, status, done_at, result_via)
SELECT 'customer_metadata', 'cus_' || g, '{"metadata": {"k": "v"}}', 'k_' || g, 'evt_' || g,
       CASE WHEN g % 5000 = 0 THEN 'pending' WHEN g % 5000 = 1 THEN 'parked' ELSE 'done' END,
       CASE WHEN g % 5000 > 1 THEN now() END, CASE WHEN g % 5000 > 1 THEN 'call' END
  FROM generate_series(1, 20000) AS g`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, "ANALYZE writeback_intents")
	require.NoError(t, err)
	b, err := ReadBacklog(ctx, db.Pool, nil)
	require.NoError(t, err)
	require.Equal(t, 4, b.Pending)
	require.Equal(t, 4, b.Parked)

	rows, err := db.Pool.Query(ctx, "EXPLAIN "+backlog, nil)
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	plan := strings.Join(lines, "\n")
	require.NotContains(t, plan, "Seq Scan", plan)
	require.Contains(t, plan, "writeback_intents_pending", plan)
	require.Contains(t, plan, "writeback_intents_parked", plan)
}
