package handlers

// What operators read of the business tables, and resolving an anomaly
// (internal/ops, cmd/inboxctl). The SQL is at the end of this file: these
// statements are the operators', not the handlers'.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stripe-inbox/inbox/internal/outbox"
)

// InvoiceState is an invoice as an operator sees it.
type InvoiceState struct {
	ID         string     `json:"id"`
	Account    string     `json:"account,omitempty"` // the connected account; "" the platform's own
	CustomerID string     `json:"customer_id"`
	Status     string     `json:"status"`
	Currency   string     `json:"currency,omitempty"`
	AmountDue  int64      `json:"amount_due"`
	AmountPaid int64      `json:"amount_paid"`
	PaidAt     *time.Time `json:"paid_at,omitempty"`
	UpdatedAt  time.Time  `json:"updated_at"`
}

// LedgerEntry is one booked money movement.
type LedgerEntry struct {
	ID        int64     `json:"id"`
	InvoiceID string    `json:"invoice_id"`
	Account   string    `json:"account,omitempty"` // the connected account; "" the platform's own
	Kind      string    `json:"kind"`
	Amount    int64     `json:"amount"`
	Currency  string    `json:"currency,omitempty"`
	EventID   string    `json:"event_id"`
	CreatedAt time.Time `json:"created_at"`
}

// OutboxRow is one queued notification (the outbox table's SQL is
// internal/outbox's).
type OutboxRow = outbox.Queued

// Anomaly is one anomalies row.
type Anomaly struct {
	ID         int64           `json:"id"`
	Kind       string          `json:"kind"`
	SubjectID  string          `json:"subject_id"`
	Account    string          `json:"account,omitempty"` // the connected account; "" the platform's own
	Endpoint   string          `json:"endpoint"`
	EventID    string          `json:"event_id"`
	Detail     json.RawMessage `json:"detail"`
	CreatedAt  time.Time       `json:"created_at"`
	ResolvedAt *time.Time      `json:"resolved_at,omitempty"`
	Resolution string          `json:"resolution,omitempty"`
}

// Effects are the business rows one receipt produced or touched.
type Effects struct {
	// Invoices: the event's object when it is an invoice, and the invoices
	// its ledger entries are booked under, as they are now.
	Invoices  []InvoiceState `json:"invoices"`
	Ledger    []LedgerEntry  `json:"ledger"`
	Outbox    []OutboxRow    `json:"outbox"`
	Anomalies []Anomaly      `json:"anomalies"`
}

// EffectsOf reads the effects of the event eventID whose data.object.id is
// objectID, of account ("" the platform's own): the ledger entries it booked (ledger_entries.event_id), the
// notifications it queued (outbox payload event_id), the anomalies it
// raised first, and the invoices concerned.
func EffectsOf(ctx context.Context, db DB, eventID, objectID, account string) (Effects, error) {
	e := Effects{Invoices: []InvoiceState{}, Ledger: []LedgerEntry{}, Outbox: []OutboxRow{}, Anomalies: []Anomaly{}}
	rows, err := db.Query(ctx, opsLedgerOf, eventID)
	if err != nil {
		return e, fmt.Errorf("reading the ledger entries of %s: %w", eventID, err)
	}
	if e.Ledger, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (LedgerEntry, error) {
		var l LedgerEntry
		return l, r.Scan(&l.ID, &l.InvoiceID, &l.Account, &l.Kind, &l.Amount, &l.Currency, &l.EventID, &l.CreatedAt)
	}); err != nil {
		return e, fmt.Errorf("reading the ledger entries of %s: %w", eventID, err)
	}
	if e.Outbox, err = outbox.QueuedBy(ctx, db, eventID); err != nil {
		return e, err
	}
	if rows, err = db.Query(ctx, opsAnomaliesOf, eventID); err != nil {
		return e, fmt.Errorf("reading the anomalies of %s: %w", eventID, err)
	}
	if e.Anomalies, err = pgx.CollectRows(rows, scanAnomaly); err != nil {
		return e, fmt.Errorf("reading the anomalies of %s: %w", eventID, err)
	}
	if rows, err = db.Query(ctx, opsInvoicesOf, eventID, objectID, account); err != nil {
		return e, fmt.Errorf("reading the invoices of %s: %w", eventID, err)
	}
	if e.Invoices, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (InvoiceState, error) {
		var i InvoiceState
		return i, r.Scan(&i.ID, &i.Account, &i.CustomerID, &i.Status, &i.Currency, &i.AmountDue, &i.AmountPaid, &i.PaidAt, &i.UpdatedAt)
	}); err != nil {
		return e, fmt.Errorf("reading the invoices of %s: %w", eventID, err)
	}
	return e, nil
}

func scanAnomaly(r pgx.CollectableRow) (Anomaly, error) {
	var a Anomaly
	return a, r.Scan(&a.ID, &a.Kind, &a.SubjectID, &a.Account, &a.Endpoint, &a.EventID, &a.Detail, &a.CreatedAt, &a.ResolvedAt, &a.Resolution)
}

// ListAnomalies returns the unresolved anomalies (all of them, resolved
// too, when all is true; then at most limit), oldest first.
func ListAnomalies(ctx context.Context, db DB, all bool, limit int) ([]Anomaly, error) {
	rows, err := db.Query(ctx, opsListAnomalies, all, limit)
	if err != nil {
		return nil, fmt.Errorf("listing anomalies: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanAnomaly)
	if err != nil {
		return nil, fmt.Errorf("listing anomalies: %w", err)
	}
	return out, nil
}

// Errors of ResolveAnomaly, matched with errors.Is.
var (
	ErrNoSuchAnomaly   = errors.New("no such anomaly")
	ErrAlreadyResolved = errors.New("anomaly already resolved")
)

// ResolveAnomaly marks the unresolved anomaly id resolved with note and
// returns it. It fails with ErrNoSuchAnomaly or ErrAlreadyResolved (the
// earlier resolution is kept) and changes nothing then.
func ResolveAnomaly(ctx context.Context, db DB, id int64, note string) (Anomaly, error) {
	rows, err := db.Query(ctx, opsResolveAnomaly, id, note)
	if err != nil {
		return Anomaly{}, fmt.Errorf("resolving anomaly %d: %w", id, err)
	}
	a, err := pgx.CollectExactlyOneRow(rows, scanAnomaly)
	if err == nil {
		return a, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return Anomaly{}, fmt.Errorf("resolving anomaly %d: %w", id, err)
	}
	rows, err = db.Query(ctx, opsAnomaly, id)
	if err != nil {
		return Anomaly{}, fmt.Errorf("reading anomaly %d: %w", id, err)
	}
	a, err = pgx.CollectExactlyOneRow(rows, scanAnomaly)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Anomaly{}, fmt.Errorf("%w: %d", ErrNoSuchAnomaly, id)
	case err != nil:
		return Anomaly{}, fmt.Errorf("reading anomaly %d: %w", id, err)
	}
	return a, fmt.Errorf("%w: %d on %s (%s)", ErrAlreadyResolved, id, a.ResolvedAt.UTC().Format(time.RFC3339), a.Resolution)
}

// opsLedgerOf: $1 event_id.
const opsLedgerOf = `
SELECT id, invoice_id, coalesce(account, ''), kind, amount, coalesce(currency, ''), event_id, created_at
  FROM ledger_entries WHERE event_id = $1 ORDER BY id`

const anomalyColumns = `id, kind, subject_id, coalesce(account, ''), endpoint, event_id, detail, created_at, resolved_at, coalesce(resolution, '')`

// opsAnomaliesOf: $1 event_id (the receipt that raised it first).
const opsAnomaliesOf = `SELECT ` + anomalyColumns + ` FROM anomalies WHERE event_id = $1 ORDER BY id`

// opsInvoicesOf: $1 event_id, $2 the event's object id, $3 its account ("" the platform).
const opsInvoicesOf = `
SELECT id, coalesce(account, ''), customer_id, status, coalesce(currency, ''), amount_due, amount_paid, paid_at, updated_at
  FROM invoices AS i
 WHERE (id = $2 AND account IS NOT DISTINCT FROM nullif($3, ''))
    OR (id, coalesce(account, '')) IN (SELECT invoice_id, coalesce(account, '') FROM ledger_entries WHERE event_id = $1)
 ORDER BY id`

// opsListAnomalies: $1 all (resolved too), $2 limit.
const opsListAnomalies = `
SELECT ` + anomalyColumns + ` FROM anomalies
 WHERE $1::bool OR resolved_at IS NULL
 ORDER BY created_at, id
 LIMIT $2`

// opsResolveAnomaly: $1 id, $2 note. Only an unresolved anomaly; a
// concurrent resolve waits for the row lock and then finds it resolved.
const opsResolveAnomaly = `
UPDATE anomalies SET resolved_at = now(), resolution = $2
 WHERE id = $1 AND resolved_at IS NULL
RETURNING ` + anomalyColumns

// opsAnomaly: $1 id.
const opsAnomaly = `SELECT ` + anomalyColumns + ` FROM anomalies WHERE id = $1`
