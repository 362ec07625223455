package retention_test

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/retention"
)

// TestNewValidates: as River's NewClient, New fills the defaults and refuses
// a configuration that would delete receipts inside Stripe's retry window
// (or is otherwise wrong), saying what to fix.
func TestNewValidates(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))

	p, err := retention.New(db.Pool, retention.Config{}, logger, nil)
	require.NoError(t, err, "the zero values take the defaults")
	require.NotNil(t, p)

	p, err = retention.New(db.Pool, retention.Config{Retention: 3 * retention.Day, DeadlineMargin: time.Hour}, logger, nil)
	require.Nil(t, p)
	require.ErrorContains(t, err, "invalid purge configuration")
	require.ErrorContains(t, err, "RETENTION_DAYS=3: must be at least 4 days")
	require.ErrorContains(t, err, "DEADLINE_MARGIN=1h0m0s: must be from 1s to 15m")

	_, err = retention.New(nil, retention.Config{}, nil, nil)
	require.ErrorContains(t, err, "no database")
	require.ErrorContains(t, err, "no logger")
}
