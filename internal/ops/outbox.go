package ops

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stripe-inbox/inbox/internal/outbox"
)

// MaxOutboxIDs bounds the ids of one outbox-retry (--waiting retries any
// number).
const MaxOutboxIDs = 1000

// OutboxPage is one page of unpublished outbox rows, newest first: those
// waiting for a human, or every unpublished row with AllUnpublished. Next
// continues it (Request.After); empty on the last page.
type OutboxPage struct {
	Rows []outbox.Row `json:"rows"`
	// Count is the rows on this page.
	Count          int    `json:"count"`
	AllUnpublished bool   `json:"all_unpublished"`
	MaxAttempts    int    `json:"max_attempts"`
	Next           string `json:"next,omitempty"`
}

func (o *Ops) outboxRows(ctx context.Context, r Request) (*OutboxPage, error) {
	limit := r.Limit
	if limit == 0 {
		limit = DefaultLimit
	}
	var after *outbox.PageKey
	if r.After != "" {
		k, err := decodeOutboxCursor(r.After)
		if err != nil {
			return nil, err
		}
		after = &k
	}
	rows, err := outbox.List(ctx, o.Pool, o.OutboxMaxAttempts, r.AllUnpublished, after, limit+1)
	if err != nil {
		return nil, err
	}
	p := &OutboxPage{Rows: rows, AllUnpublished: r.AllUnpublished, MaxAttempts: o.OutboxMaxAttempts}
	if len(rows) > limit {
		p.Rows = rows[:limit]
		last := p.Rows[limit-1]
		b, _ := json.Marshal(outbox.PageKey{CreatedAt: last.CreatedAt, ID: last.ID})
		p.Next = base64.RawURLEncoding.EncodeToString(b)
	}
	if p.Rows == nil {
		p.Rows = []outbox.Row{}
	}
	p.Count = len(p.Rows)
	return p, nil
}

func decodeOutboxCursor(s string) (outbox.PageKey, error) {
	var k outbox.PageKey
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err == nil {
		err = json.Unmarshal(b, &k)
	}
	if err != nil || k.CreatedAt.IsZero() || k.ID <= 0 {
		return k, invalidf("--after %q is not a page cursor of inboxctl outbox: pass the \"next\" value of the previous page", s)
	}
	return k, nil
}

func (r Request) checkOutboxRetry() error {
	switch {
	case len(r.OutboxIDs) == 0 && !r.Waiting:
		return invalidf("outbox-retry needs outbox row IDs (inboxctl outbox lists them) or --waiting for every row waiting for a human; try it with --dry-run first")
	case len(r.OutboxIDs) > 0 && r.Waiting:
		return invalidf("outbox-retry takes IDs or --waiting, not both")
	case len(r.OutboxIDs) > MaxOutboxIDs:
		return invalidf("outbox-retry of %d IDs: give at most %d, or --waiting for all of them", len(r.OutboxIDs), MaxOutboxIDs)
	}
	for _, id := range r.OutboxIDs {
		if id <= 0 {
			return invalidf("outbox row ID %d: an ID is a positive number (inboxctl outbox lists them)", id)
		}
	}
	return checkText("--reason", r.Reason, "say why, e.g. --reason 'fixed the event rule, ticket 123'")
}

// OutboxRetryResult says what an outbox-retry changed (or, with DryRun,
// would change).
type OutboxRetryResult struct {
	DryRun bool `json:"dry_run"`
	// Count is how many rows were (would be) given fresh attempts.
	Count int `json:"count"`
	// IDs are their ids, ascending, at most MaxListedKeys (Truncated then).
	IDs       []int64 `json:"outbox_ids"`
	Truncated bool    `json:"truncated,omitempty"`
	// AuditID is the ops_audit row (0 for a dry run).
	AuditID int64 `json:"audit_id,omitempty"`
}

// outboxRetry resets the rows in one statement (outbox.RetryRows) and
// writes its audit row in the same transaction. Named ids must all be
// rows waiting for a human: an unknown id is not found, a published row or
// one still being tried is a conflict, and nothing is changed then.
func (o *Ops) outboxRetry(ctx context.Context, r Request, c Caller) (*OutboxRetryResult, error) {
	res := &OutboxRetryResult{DryRun: r.DryRun, IDs: []int64{}}
	var ids []int64 // nil: every waiting row
	if !r.Waiting {
		ids = slices.Clone(r.OutboxIDs)
		slices.Sort(ids)
		ids = slices.Compact(ids)
	}
	err := pgx.BeginFunc(ctx, o.Pool, func(tx pgx.Tx) error {
		got, err := outbox.RetryRows(ctx, tx, o.OutboxMaxAttempts, ids, r.DryRun)
		if err != nil {
			return err
		}
		if ids != nil && len(got) < len(ids) {
			if err := o.whyNotRetried(ctx, tx, ids, got); err != nil {
				return err // rolls the statement back
			}
		}
		res.Count = len(got)
		res.IDs = got
		if len(got) > MaxListedKeys {
			res.IDs, res.Truncated = got[:MaxListedKeys], true
		}
		if r.DryRun {
			return nil
		}
		res.AuditID, err = recordAudit(ctx, tx, audit{Action: CmdOutboxRetry, Filter: outboxAuditFilter(r, ids), Affected: len(got), Reason: r.Reason, Caller: c,
			Touched: map[string]any{"outbox": append([]int64{}, got...)}})
		return err
	})
	if err != nil {
		return nil, err
	}
	o.log(ctx, CmdOutboxRetry, r, c, res.Count, res.AuditID)
	return res, nil
}

// whyNotRetried names the first id of ids that the retry left alone, and
// why, as an operator mistake.
func (o *Ops) whyNotRetried(ctx context.Context, tx pgx.Tx, ids, got []int64) error {
	states, err := outbox.RowStates(ctx, tx, ids)
	if err != nil {
		return err
	}
	var unknown []string
	for _, id := range ids {
		if _, ok := states[id]; !ok {
			unknown = append(unknown, fmt.Sprint(id))
		}
	}
	if len(unknown) > 0 {
		return &Error{Kind: KindNotFound, Message: fmt.Sprintf("no outbox row %s: check the IDs (inboxctl outbox lists the rows waiting for a human); nothing changed", strings.Join(unknown, ", "))}
	}
	for _, id := range ids {
		if slices.Contains(got, id) {
			continue
		}
		st := states[id]
		var why string
		switch {
		case st.PublishedAt != nil:
			why = fmt.Sprintf("was published at %s: there is nothing to retry", st.PublishedAt.UTC().Format(time.RFC3339))
		case st.Attempts < o.OutboxMaxAttempts:
			why = fmt.Sprintf("is still being tried by the relay (%d of %d attempts): it waits for nobody", st.Attempts, o.OutboxMaxAttempts)
		default:
			until := "now"
			if st.LeasedUntil != nil {
				until = "until " + st.LeasedUntil.UTC().Format(time.RFC3339)
			}
			why = fmt.Sprintf("is held by a relay (its last attempt, %s): run inboxctl outbox after that", until)
		}
		return &Error{Kind: KindConflict, Message: fmt.Sprintf("outbox row %d %s; only rows waiting for a human are retried; nothing changed", id, why)}
	}
	return nil
}

// outboxAuditFilter is what selected the rows, as recorded.
func outboxAuditFilter(r Request, ids []int64) map[string]any {
	if r.Waiting {
		return map[string]any{"waiting": true}
	}
	return map[string]any{"outbox_ids": ids}
}
