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

// auditFilter is what selected the rows, as recorded.
func auditFilter(r Request) map[string]any {
	m := map[string]any{}
	if r.EventID != "" {
		m["event_id"] = r.EventID
	}
	if r.AnomalyID != 0 {
		m["anomaly_id"] = r.AnomalyID
	}
	if len(r.OutboxIDs) > 0 {
		m["outbox_ids"] = r.OutboxIDs
	}
	if r.Waiting {
		m["waiting"] = true
	}
	f := r.Filter
	for k, v := range map[string]string{"endpoint": f.Endpoint, "type": f.Type, "state": f.State, "error": f.Error} {
		if v != "" {
			m[k] = v
		}
	}
	if f.Since != nil {
		m["since"] = f.Since.UTC()
	}
	if f.Until != nil {
		m["until"] = f.Until.UTC()
	}
	return m
}

func (o *Ops) log(ctx context.Context, action string, r Request, c Caller, affected int, auditID int64) {
	if o.Logger == nil {
		return
	}
	o.Logger.InfoContext(ctx, "operator change", "action", action, "filter", auditFilter(r), "affected", affected,
		"dry_run", r.DryRun, "reason", strings.TrimSpace(r.Reason+r.Note), "actor", c.Actor, "request_id", c.RequestID, "audit_id", auditID)
}
