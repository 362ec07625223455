package retention

import (
	"context"
	"io/fs"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/migrations"
)

// The batch queries must pick their rows through the partial indexes of
// migrations/0004 (a partial index is usable only when the query implies its
// predicate), and the outer statement must look the picked rows up directly
// rather than scan the table. The tables hold enough rows, analysed, for the
// planner to choose as it would in production.
func TestBatchQueriesUseTheRetentionIndexes(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	ctx := context.Background()
	for _, q := range []string{`
INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, payload, received_at, available_at, attempts, processed_at, outcome)
SELECT 'stripe', 'billing', 'evt_' || g, 'invoice.paid', false, jsonb_build_object('id', 'evt_' || g, 'pad', repeat('x', 200)),
       now() - g * interval '1 minute', now(), 1,
       CASE WHEN g % 20 <> 0 THEN now() - g * interval '1 minute' END, CASE WHEN g % 20 <> 0 THEN 'applied' END
  FROM generate_series(1, 100000) AS g`, `
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at, published_at)
SELECT 'Invoice', 'in_' || g, 'InvoicePaymentBooked', '{}', now() - g * interval '1 minute',
       CASE WHEN g % 20 <> 0 THEN now() - g * interval '1 minute' END
  FROM generate_series(1, 100000) AS g`,
		"ANALYZE webhook_inbox", "ANALYZE outbox",
	} {
		_, err := db.Pool.Exec(ctx, q)
		require.NoError(t, err)
	}
	for name, tc := range map[string]struct {
		query, index, outer string
		cutoff              time.Time
	}{
		"receipts": {deleteReceipts, "Index Scan using webhook_inbox_processed", "Tid Scan on webhook_inbox", time.Now().Add(-30 * Day)},
		"outbox":   {deleteOutbox, "Index Scan using outbox_published", "Index Scan using outbox_pkey", time.Now().Add(-30 * Day)},
		"scrub":    {scrubPayloads, "Index Scan using webhook_inbox_unscrubbed", "Tid Scan on webhook_inbox", time.Now().Add(-7 * Day)},
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

// The scrub query and the index webhook_inbox_unscrubbed must name the same
// marker, or the index stops matching the query.
func TestScrubMarkerMatchesTheIndex(t *testing.T) {
	t.Parallel()
	sql, err := fs.ReadFile(migrations.FS, "0004_retention_indexes.sql")
	require.NoError(t, err)
	marker := "payload <> '" + scrubbedPayload + "'::jsonb"
	require.Contains(t, string(sql), marker)
	require.Contains(t, scrubPayloads, marker)
	require.Contains(t, scrubPayloads, "SET payload = '"+scrubbedPayload+"'::jsonb")
}
