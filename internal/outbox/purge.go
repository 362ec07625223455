package outbox

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Execer is what a purge batch needs: a pool or a connection, never a
// transaction, since each batch commits on its own.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// PurgePublished deletes up to limit published rows whose published_at is
// strictly before cutoff, oldest first, in one statement that commits on
// its own and skips rows another transaction holds, and returns how many it
// deleted. An unpublished row is never deleted. internal/retention runs the
// batches.
func PurgePublished(ctx context.Context, db Execer, cutoff time.Time, limit int) (int64, error) {
	tag, err := db.Exec(ctx, deletePublished, cutoff, limit)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}
