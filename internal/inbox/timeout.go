package inbox

import (
	"context"
	"fmt"
	"time"
)

// SetLocalStatementTimeout bounds every later statement of tx, lock waits
// included, by d: statement_timeout for tx only (it ends with the commit or
// the rollback). The server cancels a statement that runs or waits longer,
// and the connection stays usable. The worker's processing transactions run
// under it.
func SetLocalStatementTimeout(ctx context.Context, tx DB, d time.Duration) error {
	if _, err := tx.Exec(ctx, setLocalStatementTimeout, fmt.Sprintf("%dms", max(d.Milliseconds(), 1))); err != nil { // 0 would mean none
		return fmt.Errorf("setting statement_timeout: %w", err)
	}
	return nil
}
