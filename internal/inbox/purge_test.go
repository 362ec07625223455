package inbox

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

// The purge's batches must pick their rows through the partial indexes of
// migrations/0004 (a partial index is usable only when the query implies
// its predicate), and the outer statement must look the picked rows up by
// ctid rather than scan the table. The table holds enough rows, analysed,
// for the planner to choose as it would in production.
func TestPurgeBatchesUseTheRetentionIndexes(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	ctx := context.Background()
	for _, q := range []string{`
INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, payload, received_at, available_at, attempts, processed_at, outcome)
SELECT 'stripe', 'billing', 'evt_' || g, 'invoice.paid', false, jsonb_build_object('id', 'evt_' || g, 'pad', repeat('x', 200)),
       now() - g * interval '1 minute', now(), 1,
       CASE WHEN g % 20 <> 0 THEN now() - g * interval '1 minute' END, CASE WHEN g % 20 <> 0 THEN 'applied' END
  FROM generate_series(1, 100000) AS g`,
		"ANALYZE webhook_inbox",
	} {
		_, err := db.Pool.Exec(ctx, q)
		require.NoError(t, err)
	}
	const day = 24 * time.Hour
	for name, tc := range map[string]struct {
		query, index string
		cutoff       time.Time
	}{
		"delete": {deleteReceipts, "Index Scan using webhook_inbox_processed", time.Now().Add(-30 * day)},
		"scrub":  {scrubPayloads, "Index Scan using webhook_inbox_unscrubbed", time.Now().Add(-7 * day)},
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
			require.Contains(t, text, "Tid Scan on webhook_inbox", text)
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

// TestPurgeAndScrubTouchOnlyProcessedReceiptsPastTheCutoff: one batch each,
// bounded by its limit; an unprocessed receipt (also one waiting for review)
// and a receipt processed at the cutoff stay; a scrubbed receipt keeps its key.
func TestPurgeAndScrubTouchOnlyProcessedReceiptsPastTheCutoff(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	ctx := context.Background()
	cutoff := time.Now().Add(-48 * time.Hour).UTC().Truncate(time.Microsecond)
	_, err := db.Pool.Exec(ctx, `
INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, payload, payload_raw, attempts, available_at, processed_at, outcome)
VALUES ('stripe', 'billing', 'evt_old_1', 'x', false, '{"a":1}', '\x00', 1, now(), $1::timestamptz - interval '2 hours', 'applied'),
       ('stripe', 'billing', 'evt_old_2', 'x', false, '{"a":2}', NULL, 1, now(), $1::timestamptz - interval '1 hour', 'applied'),
       ('stripe', 'billing', 'evt_at_cutoff', 'x', false, '{"a":3}', NULL, 1, now(), $1, 'applied'),
       ('stripe', 'billing', 'evt_review', 'x', false, '{"a":4}', NULL, 10, 'infinity', NULL, NULL),
       ('stripe', 'billing', 'evt_new', 'x', false, '{"a":5}', NULL, 0, now(), NULL, NULL)`, cutoff)
	require.NoError(t, err)

	n, err := ScrubPayloads(ctx, db.Pool, cutoff, 1)
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "one batch of at most its limit")
	require.Equal(t, 1, db.Count(t, "webhook_inbox", `event_id = 'evt_old_1' AND payload = '{"scrubbed": true}' AND payload_raw IS NULL`), "oldest first")
	n, err = ScrubPayloads(ctx, db.Pool, cutoff, 10)
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "a scrubbed receipt is not scrubbed again")
	require.Equal(t, 2, db.Count(t, "webhook_inbox", `payload = '{"scrubbed": true}'`))

	n, err = PurgeProcessed(ctx, db.Pool, cutoff, 10)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	require.Equal(t, 3, db.Count(t, "webhook_inbox", "event_id IN ('evt_at_cutoff', 'evt_review', 'evt_new')"))
	require.Equal(t, 3, db.Count(t, "webhook_inbox", ""))
}
