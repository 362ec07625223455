package inbox

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/stripeevent"
	"github.com/stripe-inbox/inbox/internal/stripetest"
)

func parsed(t *testing.T, id string) stripeevent.Event {
	t.Helper()
	ev, err := stripeevent.Parse(stripetest.Event(id, "invoice.paid", stripetest.Invoice("in_"+id, "cus_1", "paid", 100)))
	require.NoError(t, err)
	return ev
}

// TestStoreFromKeepsTheFirstSource: the webhook and the reconciler store with
// the same statement; whichever is second is a duplicate, and the receipt
// keeps the source that stored it.
func TestStoreFromKeepsTheFirstSource(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	ctx := context.Background()

	out, err := Store(ctx, db.Pool, "billing", parsed(t, "evt_w"))
	require.NoError(t, err)
	require.Equal(t, Stored, out)
	out, err = StoreFrom(ctx, db.Pool, SourceReconcile, "billing", parsed(t, "evt_w"))
	require.NoError(t, err)
	require.Equal(t, Duplicate, out)

	out, err = StoreFrom(ctx, db.Pool, SourceReconcile, "billing", parsed(t, "evt_r"))
	require.NoError(t, err)
	require.Equal(t, Stored, out)
	out, err = StoreAndNotify(ctx, db.Pool, "billing", parsed(t, "evt_r"))
	require.NoError(t, err)
	require.Equal(t, Duplicate, out)

	require.Equal(t, 1, db.Count(t, "webhook_inbox", "event_id = 'evt_w' AND source = 'webhook'"))
	require.Equal(t, 1, db.Count(t, "webhook_inbox", "event_id = 'evt_r' AND source = 'reconcile' AND api_version = $1", stripetest.APIVersion))

	_, err = StoreFrom(ctx, db.Pool, Source("elsewhere"), "billing", parsed(t, "evt_x"))
	require.ErrorContains(t, err, `unknown source "elsewhere"`)
	require.Equal(t, 0, db.Count(t, "webhook_inbox", "event_id = 'evt_x'"))
	_, err = db.Pool.Exec(ctx, `INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, payload, source)
		VALUES ('stripe', 'billing', 'evt_y', 'x', false, '{}', 'elsewhere')`)
	require.ErrorContains(t, err, "webhook_inbox_source_check")
}

// TestHighWaterOnlyMovesForward: the mark is absent until first set, and a
// mark older than the stored one (a backfill, a racing reconciler) leaves it.
func TestHighWaterOnlyMovesForward(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	ctx := context.Background()

	_, ok, err := HighWater(ctx, db.Pool, "billing")
	require.NoError(t, err)
	require.False(t, ok)

	t1 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	got, err := AdvanceHighWater(ctx, db.Pool, "billing", t1)
	require.NoError(t, err)
	require.True(t, got.Equal(t1))
	got, err = AdvanceHighWater(ctx, db.Pool, "billing", t1.Add(-time.Hour))
	require.NoError(t, err)
	require.True(t, got.Equal(t1), "never backwards")
	hw, ok, err := HighWater(ctx, db.Pool, "billing")
	require.NoError(t, err)
	require.True(t, ok)
	require.True(t, hw.Equal(t1))

	_, ok, err = HighWater(ctx, db.Pool, "connect")
	require.NoError(t, err)
	require.False(t, ok, "one mark per endpoint")
}
