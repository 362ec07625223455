package ops

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// audit is one ops_audit row (migrations/0012_ops.sql, 0016).
type audit struct {
	Action   string
	Filter   map[string]any
	Affected int
	Reason   string
	Caller   Caller
	// Touched are the keys of the rows the change touched, by table
	// ({"webhook_inbox": [[endpoint, event_id], ...]}, {"anomalies": [id]},
	// {"outbox": [id, ...]}).
	Touched map[string]any
}

// recordAudit writes a in tx, the transaction of the change it records,
// and returns its id. actor is the verified principal's ARN when there is
// one, else the name the caller gave; that name is also kept, as given, in
// claimed_actor, never in place of a verified identity.
func recordAudit(ctx context.Context, tx pgx.Tx, a audit) (int64, error) {
	filter, err := json.Marshal(a.Filter)
	if err != nil {
		return 0, fmt.Errorf("encoding the audit filter: %w", err)
	}
	touched, err := json.Marshal(a.Touched)
	if err != nil {
		return 0, fmt.Errorf("encoding the audit row's keys: %w", err)
	}
	claimed := optional(strings.TrimSpace(a.Caller.Actor))
	actor := "unknown"
	if claimed != nil {
		actor = *claimed
	}
	var arn, principalID *string
	if p := a.Caller.Principal; p != nil {
		actor, arn, principalID = p.ARN, &p.ARN, optional(p.UserID)
	}
	var id int64
	if err := tx.QueryRow(ctx, insertAudit, a.Action, string(filter), a.Affected, strings.TrimSpace(a.Reason), actor,
		optional(a.Caller.RequestID), arn, principalID, claimed, string(touched)).Scan(&id); err != nil {
		return 0, fmt.Errorf("writing the audit row: %w", err)
	}
	return id, nil
}

func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// insertAudit: $1 action, $2 filter (json text), $3 affected, $4 reason,
// $5 actor, $6 Lambda request id (NULL locally), $7 principal_arn and $8
// principal_id (NULL without a verified identity), $9 claimed_actor, $10
// touched (json text). The only statement on ops_audit besides what an
// operator reads with psql; rows are never updated or deleted.
const insertAudit = `
INSERT INTO ops_audit (action, filter, affected, reason, actor, request_id, principal_arn, principal_id, claimed_actor, touched)
VALUES ($1, $2::jsonb, $3, $4, $5, $6, $7, $8, $9, $10::jsonb)
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
	principal := ""
	if c.Principal != nil {
		principal = c.Principal.ARN
	}
	o.Logger.InfoContext(ctx, "operator change", "action", action, "filter", auditFilter(r), "affected", affected,
		"dry_run", r.DryRun, "reason", strings.TrimSpace(r.Reason+r.Note), "principal", principal, "claimed_actor", c.Actor,
		"request_id", c.RequestID, "audit_id", auditID)
}
