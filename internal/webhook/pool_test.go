package webhook_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/database"
	"github.com/stripe-inbox/inbox/internal/pgtest"
)

// poolOfOne opens a pool with one connection, configured as the functions'
// pools are (database.Open), so tests run the production settings.
func poolOfOne(t *testing.T, db *pgtest.Database) *pgxpool.Pool {
	t.Helper()
	pool, err := database.Open(context.Background(), database.Config{URL: db.URL, MaxConns: 1}, nil)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}
