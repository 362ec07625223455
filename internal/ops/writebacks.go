package ops

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/stripe-inbox/inbox/internal/writeback"
)

// WritebackList is the write-backs waiting for a human, oldest first.
type WritebackList struct {
	Rows  []writeback.Row `json:"rows"`
	Count int             `json:"count"`
}

// WritebackRetryResult says what a writeback-retry changed (or, with
// DryRun, would change).
type WritebackRetryResult struct {
	DryRun  bool              `json:"dry_run"`
	Intent  *writeback.Detail `json:"intent"`
	AuditID int64             `json:"audit_id,omitempty"`
}

func (o *Ops) writebacks(ctx context.Context, r Request) (*WritebackList, error) {
	limit := r.Limit
	if limit == 0 {
		limit = DefaultLimit
	}
	rows, err := writeback.ListParked(ctx, o.Pool, limit)
	if err != nil {
		return nil, err
	}
	if rows == nil {
		rows = []writeback.Row{}
	}
	return &WritebackList{Rows: rows, Count: len(rows)}, nil
}

func (o *Ops) writeback(ctx context.Context, r Request) (*writeback.Detail, error) {
	d, err := writeback.Show(ctx, o.Pool, r.WritebackID)
	if errors.Is(err, writeback.ErrNoIntent) {
		return nil, &Error{Kind: KindNotFound, Message: fmt.Sprintf("no write-back %d: inboxctl writebacks lists those waiting for a human", r.WritebackID)}
	}
	return d, err
}

func (r Request) checkWriteback() error {
	if r.WritebackID <= 0 {
		return invalidf("%s needs one write-back ID, a positive number (inboxctl writebacks lists them)", r.Command)
	}
	if r.Command == CmdWritebackRetry {
		return checkText("--reason", r.Reason, "say why, e.g. --reason 'customer restored, ticket 123'; try it with --dry-run first")
	}
	return nil
}

// writebackRetry makes a parked intent due now with fresh attempts
// (writeback.RetryParked) and writes the audit row in the same
// transaction. Only a parked intent: one being tried or done is a conflict.
func (o *Ops) writebackRetry(ctx context.Context, r Request, c Caller) (*WritebackRetryResult, error) {
	res := &WritebackRetryResult{DryRun: r.DryRun}
	err := pgx.BeginFunc(ctx, o.Pool, func(tx pgx.Tx) error {
		d, err := writeback.Show(ctx, tx, r.WritebackID)
		if errors.Is(err, writeback.ErrNoIntent) {
			return &Error{Kind: KindNotFound, Message: fmt.Sprintf("no write-back %d: inboxctl writebacks lists those waiting for a human; nothing changed", r.WritebackID)}
		}
		if err != nil {
			return err
		}
		if d.Status != "parked" {
			why := "is still being tried by the sender: it waits for nobody"
			if d.Status == "done" {
				why = fmt.Sprintf("is done (%s, result %s): it is never sent again", d.ResultVia, d.ResultID)
			}
			return &Error{Kind: KindConflict, Message: fmt.Sprintf("write-back %d %s; only parked write-backs are retried; nothing changed", d.ID, why)}
		}
		res.Intent = d
		if r.DryRun {
			return nil
		}
		if _, err := writeback.RetryParked(ctx, tx, d.ID); err != nil {
			return err
		}
		res.AuditID, err = recordAudit(ctx, tx, audit{Action: CmdWritebackRetry, Filter: map[string]any{"writeback_id": d.ID}, Affected: 1, Reason: r.Reason, Caller: c,
			Touched: map[string]any{"writeback_intents": []int64{d.ID}}})
		return err
	})
	if err != nil {
		return nil, err
	}
	o.log(ctx, CmdWritebackRetry, r, c, 1, res.AuditID)
	return res, nil
}
