package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// HighWater returns the reconciler's mark for endpoint (every event created
// before it has been stored), and false when the endpoint was never
// reconciled.
func HighWater(ctx context.Context, db DB, endpoint string) (time.Time, bool, error) {
	var t time.Time
	err := db.QueryRow(ctx, highWater, ProviderStripe, endpoint).Scan(&t)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return time.Time{}, false, nil
	case err != nil:
		return time.Time{}, false, fmt.Errorf("reading the high-water mark of %s: %w", endpoint, err)
	}
	return t, true, nil
}

// AdvanceHighWater moves endpoint's mark to to, never backwards, and returns
// the mark now stored. Call it only once every event created before to has
// been stored.
func AdvanceHighWater(ctx context.Context, db DB, endpoint string, to time.Time) (time.Time, error) {
	var t time.Time
	if err := db.QueryRow(ctx, advanceHighWater, ProviderStripe, endpoint, to).Scan(&t); err != nil {
		return time.Time{}, fmt.Errorf("advancing the high-water mark of %s to %s: %w", endpoint, to.UTC().Format(time.RFC3339), err)
	}
	return t, nil
}
