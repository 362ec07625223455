package inbox

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/pgtest"
)

// planNodes flattens an EXPLAIN (FORMAT JSON) plan.
func planNodes(n map[string]any, out *[]map[string]any) {
	*out = append(*out, n)
	if kids, ok := n["Plans"].([]any); ok {
		for _, k := range kids {
			planNodes(k.(map[string]any), out)
		}
	}
}

// TestOperatorWindowsReadThroughThePartialIndexes: the status and secrets
// windows ("received since") read the two partial indexes, not the table,
// although received_at has no index: with 20,000 processed receipts older
// than the window, the plans of typesSince, versionsSince and secretsSince
// scan webhook_inbox_unprocessed and webhook_inbox_processed only, and
// count exactly the receipts of the window (processed or not).
func TestOperatorWindowsReadThroughThePartialIndexes(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	ctx := context.Background()
	for _, q := range []string{
		`INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, payload, received_at, processed_at, outcome)
		 SELECT 'stripe', 'billing', 'evt_old_' || g, 'invoice.paid', false, '{}', now() - interval '2 days' - g * interval '1 second',
		        now() - interval '2 days' - g * interval '1 second' + interval '1 second', 'applied'
		   FROM generate_series(1, 20000) g`,
		// Received before the window, processed inside it: not counted.
		`INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, payload, received_at, processed_at, outcome)
		 VALUES ('stripe', 'billing', 'evt_late', 'invoice.paid', false, '{}', now() - interval '2 hours', now() - interval '10 minutes', 'applied')`,
		`INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, payload, received_at, processed_at, outcome)
		 VALUES ('stripe', 'billing', 'evt_new_done', 'invoice.paid', false, '{}', now() - interval '5 minutes', now() - interval '4 minutes', 'applied')`,
		`INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, payload, received_at)
		 VALUES ('stripe', 'billing', 'evt_new_open', 'invoice.created', false, '{}', now() - interval '1 minute')`,
		"ANALYZE webhook_inbox",
	} {
		_, err := db.Pool.Exec(ctx, q)
		require.NoError(t, err)
	}
	since := time.Now().Add(-time.Hour)
	for name, q := range map[string]string{"typesSince": typesSince, "versionsSince": versionsSince, "secretsSince": secretsSince} {
		var raw string
		require.NoError(t, db.Pool.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+q, since).Scan(&raw), name)
		var plans []map[string]any
		require.NoError(t, json.Unmarshal([]byte(raw), &plans))
		var nodes []map[string]any
		planNodes(plans[0]["Plan"].(map[string]any), &nodes)
		var indexes []string
		for _, n := range nodes {
			require.NotEqual(t, "Seq Scan", n["Node Type"], "%s reads the whole table: %s", name, raw)
			if ix, ok := n["Index Name"].(string); ok {
				indexes = append(indexes, ix)
			}
		}
		require.ElementsMatch(t, []string{"webhook_inbox_unprocessed", "webhook_inbox_processed"}, indexes, "%s: %s", name, raw)
	}
	types, err := TypesSince(ctx, db.Pool, since)
	require.NoError(t, err)
	require.Equal(t, []TypeCount{{EventType: "invoice.created", Receipts: 1}, {EventType: "invoice.paid", Receipts: 1}}, types)
}

// TestRetryLeavesAReceiptAWorkerCompletesAlone: a retry that matches a
// receipt a worker is processing waits for the worker's row lock; when the
// worker commits, the retry re-checks the row, finds it processed and
// leaves it (and its attempts) alone; the other matching receipt is
// retried. Real connections, no sleeps: the test waits for the lock wait.
func TestRetryLeavesAReceiptAWorkerCompletesAlone(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, payload, attempts, last_error)
		VALUES ('stripe', 'billing', 'evt_busy', 'invoice.paid', false, '{}', 3, 'boom'),
		       ('stripe', 'billing', 'evt_idle', 'invoice.paid', false, '{}', 3, 'boom')`)
	require.NoError(t, err)

	worker, err := db.Connect(t).Begin(ctx)
	require.NoError(t, err)
	_, found, err := Lock(ctx, worker, Key{Provider: ProviderStripe, Endpoint: "billing", EventID: "evt_busy"})
	require.NoError(t, err)
	require.True(t, found)

	type result struct {
		keys []Key
		err  error
	}
	done := make(chan result, 1)
	go func() {
		keys, err := Retry(ctx, db.Connect(t), Filter{State: StateFailed, MaxAttempts: 10}, false)
		done <- result{keys, err}
	}()
	db.WaitForLockWaiter(t)
	_, err = MarkProcessed(ctx, worker, Key{Provider: ProviderStripe, Endpoint: "billing", EventID: "evt_busy"}, "applied", nil)
	require.NoError(t, err)
	require.NoError(t, worker.Commit(ctx))

	r := <-done
	require.NoError(t, r.err)
	require.Equal(t, []Key{{Provider: ProviderStripe, Endpoint: "billing", EventID: "evt_idle"}}, r.keys)
	require.Equal(t, 1, db.Count(t, "webhook_inbox", "event_id = 'evt_busy' AND attempts = 3 AND processed_at IS NOT NULL"))
	require.Equal(t, 1, db.Count(t, "webhook_inbox", "event_id = 'evt_idle' AND attempts = 0 AND processed_at IS NULL"))
}

// TestCountingADuplicateNeverWaits: the webhook's duplicate count skips a
// receipt whose row a worker holds (it returns at once, uncounted, while
// the lock is held: without SKIP LOCKED this call would block until the
// test's bound), and counts once the row is free.
func TestCountingADuplicateNeverWaits(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, payload)
		VALUES ('stripe', 'billing', 'evt_1', 'invoice.paid', false, '{}')`)
	require.NoError(t, err)
	counted, err := CountDuplicate(ctx, db.Pool, "billing", "evt_1")
	require.NoError(t, err)
	require.True(t, counted)

	worker, err := db.Connect(t).Begin(ctx)
	require.NoError(t, err)
	_, found, err := Lock(ctx, worker, Key{Provider: ProviderStripe, Endpoint: "billing", EventID: "evt_1"})
	require.NoError(t, err)
	require.True(t, found)
	bound, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	counted, err = CountDuplicate(bound, db.Pool, "billing", "evt_1")
	require.NoError(t, err, "returned without waiting for the worker's lock")
	require.False(t, counted)
	require.NoError(t, worker.Rollback(ctx))

	counted, err = CountDuplicate(ctx, db.Pool, "billing", "evt_1")
	require.NoError(t, err)
	require.True(t, counted)
	require.Equal(t, 1, db.Count(t, "webhook_inbox", "event_id = 'evt_1' AND duplicates = 2"))
	counted, err = CountDuplicate(ctx, db.Pool, "billing", "evt_unknown")
	require.NoError(t, err)
	require.False(t, counted)
}
