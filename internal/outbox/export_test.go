package outbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// What only the tests use: the rows waiting for a human, oldest first, and
// a retry that counts them.

// ListWaiting returns up to limit rows that used up maxAttempts, oldest
// first.
func ListWaiting(ctx context.Context, db DB, maxAttempts, limit int) ([]Waiting, error) {
	rows, err := db.Query(ctx, listWaiting, maxAttempts, limit)
	if err != nil {
		return nil, fmt.Errorf("listing outbox rows waiting for review: %w", err)
	}
	ws, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Waiting, error) {
		var w Waiting
		err := r.Scan(&w.ID, &w.AggregateType, &w.AggregateID, &w.EventType, &w.Attempts, &w.LastError, &w.CreatedAt)
		return w, err
	})
	if err != nil {
		return nil, fmt.Errorf("listing outbox rows waiting for review: %w", err)
	}
	return ws, nil
}

// Retry gives rows waiting for a human (the ids given, or all of them when
// ids is nil) a fresh count of attempts, due at once, and returns how many
// it reset. Run it after fixing the cause (last_error).
func Retry(ctx context.Context, db DB, maxAttempts int, ids []int64) (int, error) {
	got, err := RetryRows(ctx, db, maxAttempts, ids, false)
	return len(got), err
}

// listWaiting: $1 max attempts, $2 limit. The rows waiting for a human,
// oldest first.
const listWaiting = `
SELECT id, aggregate_type, aggregate_id, event_type, attempts, coalesce(last_error, ''), created_at
  FROM outbox
 WHERE published_at IS NULL AND attempts >= $1
 ORDER BY created_at, id
 LIMIT $2`
