package ops

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/stripe-inbox/inbox/internal/handlers"
)

// AnomalyList is the anomalies listed.
type AnomalyList struct {
	Anomalies []handlers.Anomaly `json:"anomalies"`
	Count     int                `json:"count"`
}

func (o *Ops) anomalies(ctx context.Context, r Request) (*AnomalyList, error) {
	limit := r.Limit
	if limit == 0 {
		limit = MaxLimit
		if r.All {
			limit = DefaultAnomalies
		}
	}
	as, err := handlers.ListAnomalies(ctx, o.Pool, r.All, limit)
	if err != nil {
		return nil, err
	}
	return &AnomalyList{Anomalies: as, Count: len(as)}, nil
}

// Resolved is a resolved anomaly and its audit row.
type Resolved struct {
	Anomaly handlers.Anomaly `json:"anomaly"`
	AuditID int64            `json:"audit_id"`
}

func (o *Ops) resolve(ctx context.Context, r Request, c Caller) (*Resolved, error) {
	res := &Resolved{}
	err := pgx.BeginFunc(ctx, o.Pool, func(tx pgx.Tx) error {
		a, err := handlers.ResolveAnomaly(ctx, tx, r.AnomalyID, strings.TrimSpace(r.Note))
		switch {
		case errors.Is(err, handlers.ErrNoSuchAnomaly):
			return &Error{Kind: KindNotFound, Message: fmt.Sprintf("no anomaly %d: inboxctl anomalies lists the open ones", r.AnomalyID)}
		case errors.Is(err, handlers.ErrAlreadyResolved):
			return &Error{Kind: KindConflict, Message: err.Error() + "; nothing changed"}
		case err != nil:
			return err
		}
		res.Anomaly = a
		res.AuditID, err = recordAudit(ctx, tx, audit{Action: CmdResolve, Filter: auditFilter(r), Affected: 1, Reason: r.Note, Caller: c,
			Touched: map[string]any{"anomalies": []int64{r.AnomalyID}}})
		return err
	})
	if err != nil {
		return nil, err
	}
	o.log(ctx, CmdResolve, r, c, 1, res.AuditID)
	return res, nil
}
