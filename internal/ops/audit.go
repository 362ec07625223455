package ops

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// audit is one ops_audit row (migrations/0012_ops.sql).
type audit struct {
	Action   string
	Filter   map[string]any
	Affected int
	Reason   string
	Caller   Caller
}

// recordAudit writes a in tx, the transaction of the change it records,
// and returns its id.
func recordAudit(ctx context.Context, tx pgx.Tx, a audit) (int64, error) {
	filter, err := json.Marshal(a.Filter)
	if err != nil {
		return 0, fmt.Errorf("encoding the audit filter: %w", err)
	}
	actor := strings.TrimSpace(a.Caller.Actor)
	if actor == "" {
		actor = "unknown"
	}
	var requestID *string
	if a.Caller.RequestID != "" {
		requestID = &a.Caller.RequestID
	}
	var id int64
	if err := tx.QueryRow(ctx, insertAudit, a.Action, string(filter), a.Affected, strings.TrimSpace(a.Reason), actor, requestID).Scan(&id); err != nil {
		return 0, fmt.Errorf("writing the audit row: %w", err)
	}
	return id, nil
}

// insertAudit: $1 action, $2 filter (json text), $3 affected, $4 reason,
// $5 actor, $6 Lambda request id (NULL locally). The only statement on
// ops_audit besides what an operator reads with psql; rows are never
// updated or deleted.
const insertAudit = `
INSERT INTO ops_audit (action, filter, affected, reason, actor, request_id)
VALUES ($1, $2::jsonb, $3, $4, $5, $6)
RETURNING id`
