package outbox

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/pgtest"
)

// The purge's batch of the outbox (deletePublished) must pick its rows
// through the partial index of migrations/0004 (a partial index is usable
// only when the query implies its predicate; the receipts' batches are
// checked the same way in internal/inbox), and the outer statement must
// look the picked rows up directly rather than scan the table. The tables
// hold enough rows, analysed, for the planner to choose as it would in
// production.
func TestBatchQueriesUseTheRetentionIndexes(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	ctx := context.Background()
	for _, q := range []string{`
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at, published_at)
SELECT 'Invoice', 'in_' || g, 'InvoicePaymentBooked', '{}', now() - g * interval '1 minute',
       CASE WHEN g % 20 <> 0 THEN now() - g * interval '1 minute' END
  FROM generate_series(1, 100000) AS g`,
		"ANALYZE outbox",
	} {
		_, err := db.Pool.Exec(ctx, q)
		require.NoError(t, err)
	}
	for name, tc := range map[string]struct {
		query, index, outer string
		cutoff              time.Time
	}{
		"outbox": {deletePublished, "Index Scan using outbox_published", "Index Scan using outbox_pkey", time.Now().Add(-30 * 24 * time.Hour)},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			rows, err := db.Pool.Query(ctx, "EXPLAIN (COSTS OFF) "+tc.query, tc.cutoff, 1000)
			require.NoError(t, err)
			var plan []string
			for rows.Next() {
				var line string
				require.NoError(t, rows.Scan(&line))
				plan = append(plan, line)
			}
			require.NoError(t, rows.Err())
			text := strings.Join(plan, "\n")
			require.Contains(t, text, "InitPlan", "the batch is picked once, before any row changes:\n%s", text)
			require.Contains(t, text, tc.index, text)
			require.Contains(t, text, tc.outer, text)
			require.NotContains(t, text, "Seq Scan", text)
			require.NotContains(t, text, "Sort", "the index gives the order:\n%s", text)
		})
	}
}
