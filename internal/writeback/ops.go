package writeback

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Row is a write-back intent as an operator sees it.
type Row struct {
	ID             int64      `json:"id"`
	Kind           string     `json:"kind"`
	Target         string     `json:"target"`
	IdempotencyKey string     `json:"idempotency_key"`
	EventID        string     `json:"event_id"`
	Status         string     `json:"status"`
	Attempts       int        `json:"attempts"`
	LastError      string     `json:"last_error,omitempty"`
	CreatedAt      time.Time  `json:"created_at"`
	FirstAttemptAt *time.Time `json:"first_attempt_at,omitempty"`
	LastAttemptAt  *time.Time `json:"last_attempt_at,omitempty"`
}

// Detail is one intent with its parameters, its result and its schedule.
type Detail struct {
	Row
	Params      json.RawMessage `json:"params"`
	ResultID    string          `json:"result_id,omitempty"`
	Result      json.RawMessage `json:"result,omitempty"`
	ResultVia   string          `json:"result_via,omitempty"`
	DoneAt      *time.Time      `json:"done_at,omitempty"`
	AvailableAt *time.Time      `json:"available_at,omitempty"`
	LeasedUntil *time.Time      `json:"leased_until,omitempty"`
	// KeyGeneration is how many times an operator retried the intent after
	// Stripe refused it; SentKey is the Idempotency-Key the sender sends
	// (IdempotencyKey, with ':retry<KeyGeneration>' once it is above 0).
	KeyGeneration int    `json:"key_generation"`
	SentKey       string `json:"sent_key"`
	// Refused: parked because Stripe refused it (a retry sends under the
	// next key generation).
	Refused bool `json:"refused"`
}

// ListParked returns up to limit intents waiting for a human, oldest first.
func ListParked(ctx context.Context, db DB, limit int) ([]Row, error) {
	rows, err := db.Query(ctx, listParked, limit)
	if err != nil {
		return nil, fmt.Errorf("listing parked write-backs: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Row, error) {
		var x Row
		err := r.Scan(&x.ID, &x.Kind, &x.Target, &x.IdempotencyKey, &x.EventID, &x.Status, &x.Attempts, &x.LastError, &x.CreatedAt,
			&x.FirstAttemptAt, &x.LastAttemptAt)
		return x, err
	})
	if err != nil {
		return nil, fmt.Errorf("listing parked write-backs: %w", err)
	}
	return out, nil
}

// ErrNoIntent means no intent has the id.
var ErrNoIntent = errors.New("no such write-back intent")

// Show returns one intent.
func Show(ctx context.Context, db DB, id int64) (*Detail, error) {
	var (
		d              Detail
		params, result string
	)
	err := db.QueryRow(ctx, showIntent, id).Scan(&d.ID, &d.Kind, &d.Target, &d.IdempotencyKey, &d.EventID, &d.Status, &d.Attempts, &d.LastError,
		&d.CreatedAt, &d.FirstAttemptAt, &d.LastAttemptAt, &params, &d.ResultID, &result, &d.ResultVia, &d.DoneAt, &d.AvailableAt, &d.LeasedUntil,
		&d.KeyGeneration, &d.Refused, &d.SentKey)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNoIntent
	}
	if err != nil {
		return nil, fmt.Errorf("reading write-back intent %d: %w", id, err)
	}
	d.Params = json.RawMessage(params)
	if result != "" {
		d.Result = json.RawMessage(result)
	}
	return &d, nil
}
