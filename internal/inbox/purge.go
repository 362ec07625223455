package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Execer is what a purge batch needs: a pool or a connection, never a
// transaction, since each batch commits on its own.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// PurgeProcessed deletes up to limit processed receipts whose processed_at
// is strictly before cutoff, oldest first, in one statement that commits on
// its own and skips rows another transaction holds, and returns how many it
// deleted. An unprocessed receipt (also one waiting for review) is never
// deleted. internal/retention runs the batches.
func PurgeProcessed(ctx context.Context, db Execer, cutoff time.Time, limit int) (int64, error) {
	tag, err := db.Exec(ctx, deleteReceipts, cutoff, limit)
	if err != nil {
		return 0, fmt.Errorf("deleting processed receipts: %w", err)
	}
	return tag.RowsAffected(), nil
}

// ScrubPayloads replaces with {"scrubbed": true} the payload (and clears the
// exact bytes, payload_raw) of up to limit processed receipts whose
// processed_at is strictly before cutoff and that are not scrubbed yet, as
// PurgeProcessed does its batch, and returns how many it scrubbed. The keys
// stay: a redelivery is still a duplicate.
func ScrubPayloads(ctx context.Context, db Execer, cutoff time.Time, limit int) (int64, error) {
	tag, err := db.Exec(ctx, scrubPayloads, cutoff, limit)
	if err != nil {
		return 0, fmt.Errorf("scrubbing receipt payloads: %w", err)
	}
	return tag.RowsAffected(), nil
}
