package inbox_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/benchsql"
	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/pgtest"
)

// TestClaimDoesNotReadNeedsReviewRows: receipts that used up their attempts
// (the last one failed, or the process died during it and its lease ended,
// or they reached the limit before this change) are left out of the range the claim reads in
// webhook_inbox_unprocessed. Shown on the claim's own plan (EXPLAIN ANALYZE
// of the real statement): its index scan returns only the claimable rows
// and removes none by its filter, where it used to read past every
// needs-review row. The backlog still counts them, and the operator's retry
// (README) brings one back.
func TestClaimDoesNotReadNeedsReviewRows(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	ctx := context.Background()
	const maxAttempts, stuck, fresh = 3, 900, 10
	insert := func(prefix string, n int) {
		t.Helper()
		_, err := db.Pool.Exec(ctx, `INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, payload)
			SELECT 'stripe', 'billing', $1 || g, 'invoice.paid', false, '{}' FROM generate_series(1, $2) g`, prefix, n)
		require.NoError(t, err)
	}

	// A third: claimed for their last attempt, by a process that died.
	insert("evt_died_", stuck/3)
	_, err := db.Pool.Exec(ctx, "UPDATE webhook_inbox SET attempts = $1 - 1", maxAttempts)
	require.NoError(t, err)
	claimed, err := inbox.Claim(ctx, db.Pool, inbox.ClaimParams{MaxAttempts: maxAttempts, Limit: stuck, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, claimed, stuck/3)

	// A third: their last attempt failed.
	insert("evt_failed_", stuck/3)
	_, err = db.Pool.Exec(ctx, "UPDATE webhook_inbox SET attempts = $1 - 1 WHERE event_id LIKE 'evt_failed_%'", maxAttempts)
	require.NoError(t, err)
	claimed, err = inbox.Claim(ctx, db.Pool, inbox.ClaimParams{MaxAttempts: maxAttempts, Limit: stuck, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, claimed, stuck/3)
	for _, c := range claimed {
		require.NoError(t, inbox.RecordFailure(ctx, db.Pool, c.Key, "boom", time.Second, nil, maxAttempts))
	}

	// The died third's leases have not ended: they are the worker's, and
	// stay. An hour on, the worker's run parks them.
	parked, err := inbox.ParkNeedsReview(ctx, db.Pool, maxAttempts, nil)
	require.NoError(t, err)
	require.Zero(t, parked, "a lease that has not ended is a worker's")
	later := time.Now().Add(time.Hour)
	parked, err = inbox.ParkNeedsReview(ctx, db.Pool, maxAttempts, &later)
	require.NoError(t, err)
	require.Equal(t, stuck/3, parked)

	insert("evt_fresh_", fresh)
	requireClaimReadsOnly := func(n int) {
		t.Helper()
		_, err = db.Pool.Exec(ctx, "ANALYZE webhook_inbox")
		require.NoError(t, err)
		// An hour on: every lease and backoff has ended.
		scan := claimIndexScan(t, db.Connect(t), time.Now().Add(time.Hour), maxAttempts)
		require.EqualValues(t, n, scan["Actual Rows"], "the index scan returns the claimable rows: %v", scan)
		require.EqualValues(t, 0, scan["Rows Removed by Filter"], "and reads no needs-review row: %v", scan)
	}
	requireClaimReadsOnly(fresh)

	// A third: at the limit with a finite available_at, as rows that
	// reached it before claims parked them; the worker parks them.
	insert("evt_legacy_", stuck/3)
	_, err = db.Pool.Exec(ctx, "UPDATE webhook_inbox SET attempts = $1, available_at = now() - interval '1 day' WHERE event_id LIKE 'evt_legacy_%'", maxAttempts)
	require.NoError(t, err)
	parked, err = inbox.ParkNeedsReview(ctx, db.Pool, maxAttempts, nil)
	require.NoError(t, err)
	require.Equal(t, stuck/3, parked)
	requireClaimReadsOnly(fresh)

	backlog, err := inbox.Stats(ctx, db.Pool, maxAttempts, nil)
	require.NoError(t, err)
	require.Equal(t, inbox.Backlog{Count: fresh, OldestAgeSeconds: backlog.OldestAgeSeconds, NeedsReview: stuck}, backlog)

	// The operator's retry (README) brings a receipt back.
	tag, err := db.Pool.Exec(ctx, `UPDATE webhook_inbox SET attempts = 0, available_at = now()
	 WHERE processed_at IS NULL AND attempts >= $1 AND event_id = 'evt_died_1'`, maxAttempts)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())
	claimed, err = inbox.Claim(ctx, db.Pool, inbox.ClaimParams{MaxAttempts: maxAttempts, Limit: fresh + 1, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, claimed, fresh+1)
}

// claimIndexScan runs the claim's statement under EXPLAIN (ANALYZE, BUFFERS,
// FORMAT JSON) (in a transaction rolled back), and returns the plan node
// that scans webhook_inbox_unprocessed.
func claimIndexScan(t *testing.T, conn *pgx.Conn, now time.Time, maxAttempts int) map[string]any {
	t.Helper()
	ctx := context.Background()
	out, err := benchsql.ExplainClaim(ctx, conn, inbox.ClaimParams{Now: &now, MaxAttempts: maxAttempts, Limit: 50, Lease: time.Minute}, "JSON")
	require.NoError(t, err)
	var plans []struct{ Plan map[string]any }
	require.NoError(t, json.Unmarshal([]byte(out), &plans))
	// The scans of webhook_inbox under the CTE that picks the rows (the
	// UPDATE then finds them by primary key).
	var found []map[string]any
	var walk func(n map[string]any, picking bool)
	walk = func(n map[string]any, picking bool) {
		picking = picking || n["Subplan Name"] == "CTE picked"
		if picking && n["Relation Name"] == "webhook_inbox" {
			found = append(found, n)
		}
		children, _ := n["Plans"].([]any)
		for _, c := range children {
			walk(c.(map[string]any), picking)
		}
	}
	walk(plans[0].Plan, false)
	require.Len(t, found, 1, "one scan picks the rows to claim:\n%s", out)
	require.Equal(t, "webhook_inbox_unprocessed", found[0]["Index Name"], "the claim scans its index:\n%s", out)
	// The worker's plan is the generic one (claimLocals), planned once per
	// connection: its index condition holds the parameter, not a value.
	require.Contains(t, found[0]["Index Cond"], "$1", "the claim runs its generic plan:\n%s", out)
	if _, ok := found[0]["Rows Removed by Filter"]; !ok {
		found[0]["Rows Removed by Filter"] = float64(0)
	}
	return found[0]
}

// TestClaimGenericPlanIsCostedForItsLimit: the claim runs a generic plan
// (claimLocals), which PostgreSQL keeps for the connection's life. With the
// limit a parameter, it planned for 10 % of the rows it estimates claimable
// (on a backlog of a million, 12,290 rows: a sort of the whole backlog, or
// a hash join over the whole table for the UPDATE, then looks cheaper, and
// grows more so with the backlog). With the limit in the claim's text, the
// plan is costed for the rows a claim takes: the ordered index scan under
// the LIMIT, then one primary-key lookup per row.
func TestClaimGenericPlanIsCostedForItsLimit(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	ctx := context.Background()
	// A history of processed receipts (on a table of a few pages, reading
	// it all is the cheaper plan, rightly) and a backlog.
	_, err := db.Pool.Exec(ctx, `INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, payload, processed_at, outcome)
		SELECT 'stripe', 'billing', 'evt_done_' || g, 'invoice.paid', false, '{}', now(), 'applied' FROM generate_series(1, 100000) g`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, payload, available_at)
		SELECT 'stripe', 'billing', 'evt_' || g, 'invoice.paid', false, '{}', now() - g * interval '1 millisecond' FROM generate_series(1, 3000) g`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, "ANALYZE webhook_inbox")
	require.NoError(t, err)
	for _, limit := range []int{50, 7} {
		out, err := benchsql.ExplainClaim(ctx, db.Connect(t), inbox.ClaimParams{MaxAttempts: 10, Limit: limit, Lease: time.Minute}, "JSON")
		require.NoError(t, err)
		var plans []struct{ Plan map[string]any }
		require.NoError(t, json.Unmarshal([]byte(out), &plans))
		var limits, joins []map[string]any
		var walk func(n map[string]any)
		walk = func(n map[string]any) {
			switch n["Node Type"] {
			case "Limit":
				limits = append(limits, n)
			case "Nested Loop", "Hash Join", "Merge Join":
				joins = append(joins, n)
			}
			require.NotEqual(t, "Seq Scan", n["Node Type"], "no claim reads the whole table:\n%s", out)
			children, _ := n["Plans"].([]any)
			for _, c := range children {
				walk(c.(map[string]any))
			}
		}
		walk(plans[0].Plan)
		require.Len(t, limits, 1, out)
		require.EqualValues(t, limit, limits[0]["Plan Rows"], "the plan is costed for the claim's limit:\n%s", out)
		require.EqualValues(t, limit, limits[0]["Actual Rows"], out)
		require.Len(t, joins, 1, out)
		require.Equal(t, "Nested Loop", joins[0]["Node Type"], "the UPDATE finds each claimed row by its key:\n%s", out)
		require.Contains(t, claimIndexScan(t, db.Connect(t), time.Now(), 10)["Index Cond"], "$1", "a generic plan")
	}
}
