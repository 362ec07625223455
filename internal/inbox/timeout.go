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
	return SetLocalTimeouts(ctx, tx, d, 0)
}

// SetLocalTimeouts is SetLocalStatementTimeout, and with a positive lock
// also bounds each lock wait of tx by lock (lock_timeout for tx only, in
// the same statement): a statement that waits longer for a lock fails with
// SQLSTATE 55P03 (lock_not_available), and only that statement (its
// savepoint) is rolled back. PostgreSQL: "lock_timeout ... Abort any
// statement that waits longer than the specified amount of time while
// attempting to acquire a lock on a table, index, row, or other database
// object" (https://www.postgresql.org/docs/15/runtime-config-client.html).
func SetLocalTimeouts(ctx context.Context, tx DB, statement, lock time.Duration) error {
	q := localTimeouts(statement, lock)
	if _, err := tx.Exec(ctx, q.sql, q.args...); err != nil {
		return fmt.Errorf("setting %s: %w", q.what, err)
	}
	return nil
}

// localTimeouts is SetLocalTimeouts' statement, to send on its own or ahead
// of another in one pipeline (BeginLockMany).
func localTimeouts(statement, lock time.Duration) queued {
	st := fmt.Sprintf("%dms", max(statement.Milliseconds(), 1)) // 0 would mean none
	if lock <= 0 {
		return queued{sql: setLocalStatementTimeout, args: []any{st}, what: "statement_timeout"}
	}
	return queued{sql: setLocalTimeouts, args: []any{st, fmt.Sprintf("%dms", max(lock.Milliseconds(), 1))}, what: "statement_timeout and lock_timeout"}
}
