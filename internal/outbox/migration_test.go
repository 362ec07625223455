package outbox_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/eventbridgetest"
	"github.com/stripe-inbox/inbox/internal/migrate"
	"github.com/stripe-inbox/inbox/internal/outbox"
	"github.com/stripe-inbox/inbox/internal/pgtest"
)

// Upgrading: rows written before 0013 that were never published (nothing
// published them until now) become due and are published; rows already
// published stay as they are.
func TestRowsFromBeforeTheRelayArePublishedAfterTheUpgrade(t *testing.T) {
	t.Parallel()
	db := pgtest.Empty(t)
	ctx := context.Background()
	conn := db.Connect(t)
	pgtest.MigrateBelow(t, conn, "0013")
	_, err := conn.Exec(ctx, `
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at, published_at)
VALUES ('Invoice', 'in_old_1', 'InvoicePaymentBooked', '{"invoice_id":"in_old_1"}', now() - interval '10 days', NULL),
       ('Invoice', 'in_old_2', 'InvoicePaymentBooked', '{"invoice_id":"in_old_2"}', now() - interval '9 days', now() - interval '9 days')`)
	require.NoError(t, err)
	_, err = migrate.Up(ctx, conn)
	require.NoError(t, err)

	pool, err := pgxpool.New(ctx, db.URL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	eb := eventbridgetest.New(t, bus)
	r, err := outbox.New(pool, eb.Client(func(o *eventbridge.Options) { o.RetryMaxAttempts = 1 }), outbox.Config{Bus: bus}, slog.New(slog.DiscardHandler), nil)
	require.NoError(t, err)
	s, err := r.Run(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, s.Published)
	require.Len(t, eb.Events(), 1)
	require.Contains(t, string(eb.Events()[0].Detail), `"aggregate_id":"in_old_1"`)
	require.Equal(t, 0, db.Count(t, "outbox", "published_at IS NULL"))
}
