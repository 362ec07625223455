package ops

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/inbox"
)

func (o *Ops) filter(r Request) inbox.Filter {
	f := r.Filter
	return inbox.Filter{Endpoint: f.Endpoint, EventType: f.Type, EventID: r.EventID, State: f.State, ErrorText: f.Error,
		Since: f.Since, Until: f.Until, MaxAttempts: o.MaxAttempts}
}

// ReceiptPage is one page of receipts, newest first. Next continues it
// (Request.After); empty on the last page.
type ReceiptPage struct {
	Receipts []inbox.Receipt `json:"receipts"`
	Count    int             `json:"count"`
	Next     string          `json:"next,omitempty"`
}

func (o *Ops) receipts(ctx context.Context, r Request) (*ReceiptPage, error) {
	limit := r.Limit
	if limit == 0 {
		limit = DefaultLimit
	}
	var after *inbox.PageKey
	if r.After != "" {
		k, err := decodeCursor(r.After)
		if err != nil {
			return nil, err
		}
		after = &k
	}
	rows, err := inbox.ListReceipts(ctx, o.Pool, o.filter(r), after, limit+1)
	if err != nil {
		return nil, err
	}
	p := &ReceiptPage{Receipts: rows}
	if len(rows) > limit {
		p.Receipts = rows[:limit]
		last := p.Receipts[limit-1]
		p.Next = encodeCursor(inbox.PageKey{ReceivedAt: last.ReceivedAt, Endpoint: last.Endpoint, EventID: last.EventID})
	}
	p.Count = len(p.Receipts)
	return p, nil
}

func encodeCursor(k inbox.PageKey) string {
	b, _ := json.Marshal(k)
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(s string) (inbox.PageKey, error) {
	var k inbox.PageKey
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err == nil {
		err = json.Unmarshal(b, &k)
	}
	if err != nil || k.ReceivedAt.IsZero() || k.Endpoint == "" || k.EventID == "" {
		return k, invalidf("--after %q is not a page cursor: pass the \"next\" value of the previous page", s)
	}
	return k, nil
}

// Shown is one event: its receipts (one per endpoint that received it) and
// what it produced.
type Shown struct {
	EventID  string           `json:"event_id"`
	Receipts []inbox.Receipt  `json:"receipts"`
	Effects  handlers.Effects `json:"effects"`
	// AuditID is the ops_audit row of a read with the payload (0 without).
	AuditID int64 `json:"audit_id,omitempty"`
}

// show reads an event's receipts and effects. With the payload (customer
// data) the read and its audit row are one transaction: no payload leaves
// without its row.
func (o *Ops) show(ctx context.Context, r Request, c Caller) (*Shown, error) {
	read := func(db inbox.DB) (*Shown, error) {
		rs, err := inbox.ReceiptsByEventID(ctx, db, r.EventID, r.Filter.Endpoint, o.MaxAttempts, r.Payload)
		if err != nil {
			return nil, err
		}
		if len(rs) == 0 {
			return nil, notFound(r.EventID, r.Filter.Endpoint)
		}
		eff, err := handlers.EffectsOf(ctx, db, r.EventID, rs[0].ObjectID, rs[0].Account)
		if err != nil {
			return nil, err
		}
		return &Shown{EventID: r.EventID, Receipts: rs, Effects: eff}, nil
	}
	if !r.Payload {
		return read(o.Pool)
	}
	var shown *Shown
	err := pgx.BeginFunc(ctx, o.Pool, func(tx pgx.Tx) error {
		var err error
		if shown, err = read(tx); err != nil {
			return err
		}
		keys := make([][2]string, 0, len(shown.Receipts))
		for _, rc := range shown.Receipts {
			keys = append(keys, [2]string{rc.Endpoint, rc.EventID})
		}
		shown.AuditID, err = recordAudit(ctx, tx, audit{Action: ActionShowPayload, Filter: auditFilter(r), Affected: len(keys), Reason: r.Reason,
			Caller: c, Touched: map[string]any{"webhook_inbox": keys}})
		return err
	})
	if err != nil {
		return nil, err
	}
	o.log(ctx, ActionShowPayload, r, c, len(shown.Receipts), shown.AuditID)
	return shown, nil
}

// ActionShowPayload is the ops_audit action of show --payload.
const ActionShowPayload = "show-payload"

func notFound(eventID, endpoint string) *Error {
	where := ""
	if endpoint != "" {
		where = " on endpoint " + endpoint
	}
	return &Error{Kind: KindNotFound, Message: fmt.Sprintf("no receipt of event %s%s: check the id (inboxctl receipts lists the newest)", eventID, where)}
}

// RetryResult says what a retry changed (or, with DryRun, would change).
type RetryResult struct {
	DryRun bool `json:"dry_run"`
	// Count is how many receipts were (would be) retried.
	Count int `json:"count"`
	// Receipts are their keys, at most MaxListedKeys (Truncated then).
	Receipts  []ReceiptKey `json:"receipts"`
	Truncated bool         `json:"truncated,omitempty"`
	// SkippedCount is how many matching receipts were (would be) left
	// alone because a worker holds them right now: its claim's lease has
	// not ended (or a failure's backoff, which looks the same). Resetting
	// one would let a second worker claim it while the first still holds
	// it. Skipped lists them (at most MaxListedKeys) with when their lease
	// or backoff ends: retry again after that if they are still
	// unprocessed.
	SkippedCount int          `json:"skipped_count"`
	Skipped      []SkippedKey `json:"skipped"`
	SkippedTrunc bool         `json:"skipped_truncated,omitempty"`
	// AuditID is the ops_audit row (0 for a dry run).
	AuditID int64 `json:"audit_id,omitempty"`
}

// SkippedKey is a receipt a retry left alone, and until when a worker holds
// it.
type SkippedKey struct {
	Endpoint string    `json:"endpoint"`
	EventID  string    `json:"event_id"`
	Until    time.Time `json:"held_until"`
}

// ReceiptKey names a receipt.
type ReceiptKey struct {
	Endpoint string `json:"endpoint"`
	EventID  string `json:"event_id"`
}

func (o *Ops) retry(ctx context.Context, r Request, c Caller) (*RetryResult, error) {
	f := o.filter(r)
	res := &RetryResult{DryRun: r.DryRun, Receipts: []ReceiptKey{}, Skipped: []SkippedKey{}}
	err := pgx.BeginFunc(ctx, o.Pool, func(tx pgx.Tx) error {
		keys, err := inbox.Retry(ctx, tx, f, r.DryRun)
		if err != nil {
			return err
		}
		held, err := inbox.RetrySkipped(ctx, tx, f)
		if err != nil {
			return err
		}
		res.SkippedCount = len(held)
		for i, h := range held {
			if i == MaxListedKeys {
				res.SkippedTrunc = true
				break
			}
			res.Skipped = append(res.Skipped, SkippedKey{Endpoint: h.Endpoint, EventID: h.EventID, Until: h.Until.UTC()})
		}
		if len(keys) == 0 && len(held) == 0 && r.EventID != "" {
			// One event: an unknown id or a processed receipt is a
			// mistake, not "nothing to do".
			rs, err := inbox.ReceiptsByEventID(ctx, tx, r.EventID, r.Filter.Endpoint, o.MaxAttempts, false)
			if err != nil {
				return err
			}
			if len(rs) == 0 {
				return notFound(r.EventID, r.Filter.Endpoint)
			}
			if f.State == "" && f.EventType == "" && f.ErrorText == "" && f.Since == nil && f.Until == nil && rs[0].ProcessedAt != nil {
				return &Error{Kind: KindConflict, Message: fmt.Sprintf("event %s is processed (outcome %s at %s): its effect has committed, there is nothing to retry",
					r.EventID, rs[0].Outcome, rs[0].ProcessedAt.UTC().Format(time.RFC3339))}
			}
		}
		res.Count = len(keys)
		touched := make([][2]string, 0, len(keys))
		for _, k := range keys {
			touched = append(touched, [2]string{k.Endpoint, k.EventID})
		}
		for i, k := range keys {
			if i == MaxListedKeys {
				res.Truncated = true
				break
			}
			res.Receipts = append(res.Receipts, ReceiptKey{Endpoint: k.Endpoint, EventID: k.EventID})
		}
		if r.DryRun {
			return nil
		}
		res.AuditID, err = recordAudit(ctx, tx, audit{Action: CmdRetry, Filter: auditFilter(r), Affected: len(keys), Reason: r.Reason, Caller: c,
			Touched: map[string]any{"webhook_inbox": touched}})
		return err
	})
	if err != nil {
		return nil, err
	}
	o.log(ctx, CmdRetry, r, c, res.Count, res.AuditID)
	return res, nil
}
