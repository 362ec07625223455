package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// Backlog is the outbox's unpublished rows.
type Backlog struct {
	// Count is the rows still being tried (fewer than MaxAttempts).
	Count int `json:"outbox_backlog"`
	// OldestAgeSeconds is the age of the oldest of them (0 when none).
	OldestAgeSeconds float64 `json:"outbox_oldest_age_seconds"`
	// NeedsReview is the rows that used up their attempts and wait for a
	// human (inboxctl outbox and outbox-retry: List, RetryRows).
	NeedsReview int `json:"outbox_needs_review"`
}

// ReadBacklog reads the backlog; now nil means the database's now().
func ReadBacklog(ctx context.Context, db DB, maxAttempts int, now *time.Time) (Backlog, error) {
	var b Backlog
	if err := db.QueryRow(ctx, backlog, maxAttempts, now).Scan(&b.Count, &b.OldestAgeSeconds, &b.NeedsReview); err != nil {
		return Backlog{}, fmt.Errorf("reading the outbox backlog: %w", err)
	}
	return b, nil
}

// Waiting is a row that waits for a human.
type Waiting struct {
	ID            int64     `json:"outbox_id"`
	AggregateType string    `json:"aggregate_type"`
	AggregateID   string    `json:"aggregate_id"`
	EventType     string    `json:"event_type"`
	Attempts      int       `json:"attempts"`
	LastError     string    `json:"last_error"`
	CreatedAt     time.Time `json:"created_at"`
}

// RetryRows gives rows waiting for a human (the ids given, or all of them
// when ids is nil) a fresh count of attempts, due at once, and returns the
// ids it reset, in order; with dryRun it returns the ids it would reset and
// changes nothing. Run it after fixing the cause (last_error). One
// statement: rows published or held by a relay (a lease that has not
// ended) are never touched, whatever ids says.
func RetryRows(ctx context.Context, db DB, maxAttempts int, ids []int64, dryRun bool) ([]int64, error) {
	q := retryWaiting
	if dryRun {
		q = retryCandidates
	}
	rows, err := db.Query(ctx, q, maxAttempts, ids)
	if err != nil {
		return nil, fmt.Errorf("retrying outbox rows: %w", err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("retrying outbox rows: %w", err)
	}
	slices.Sort(got)
	return got, nil
}

// RowState is what an id names, for an operator's retry to say why it
// would not reset a row.
type RowState struct {
	ID          int64
	PublishedAt *time.Time
	Attempts    int
	LeasedUntil *time.Time
}

// RowStates returns the states of the rows of ids that exist, by id.
func RowStates(ctx context.Context, db DB, ids []int64) (map[int64]RowState, error) {
	rows, err := db.Query(ctx, rowStates, ids)
	if err != nil {
		return nil, fmt.Errorf("reading outbox rows: %w", err)
	}
	states, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (RowState, error) {
		var st RowState
		return st, r.Scan(&st.ID, &st.PublishedAt, &st.Attempts, &st.LeasedUntil)
	})
	if err != nil {
		return nil, fmt.Errorf("reading outbox rows: %w", err)
	}
	out := make(map[int64]RowState, len(states))
	for _, st := range states {
		out[st.ID] = st
	}
	return out, nil
}

// Row is an unpublished row as an operator lists it.
type Row struct {
	Waiting
	// State is "waiting" (used up its attempts: waits for a human) or
	// "backlog" (still being tried).
	State string `json:"state"`
	// AvailableAt is when the relay may try it next (nil while waiting).
	AvailableAt *time.Time `json:"available_at,omitempty"`
	// LeasedUntil is set while a relay holds it.
	LeasedUntil *time.Time `json:"leased_until,omitempty"`
}

// States of an unpublished row.
const (
	StateWaiting = "waiting"
	StateBacklog = "backlog"
)

// PageKey is where a page of List starts: after this row.
type PageKey struct {
	CreatedAt time.Time `json:"created_at"`
	ID        int64     `json:"id"`
}

// List returns up to limit unpublished rows, newest first, after the page
// key when it is not nil: those waiting for a human, or with all every
// unpublished row.
func List(ctx context.Context, db DB, maxAttempts int, all bool, after *PageKey, limit int) ([]Row, error) {
	var at *time.Time
	var id int64
	if after != nil {
		at, id = &after.CreatedAt, after.ID
	}
	rows, err := db.Query(ctx, listRows, maxAttempts, all, at, id, limit)
	if err != nil {
		return nil, fmt.Errorf("listing outbox rows: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Row, error) {
		var w Row
		err := r.Scan(&w.ID, &w.AggregateType, &w.AggregateID, &w.EventType, &w.Attempts, &w.LastError, &w.CreatedAt, &w.AvailableAt, &w.LeasedUntil)
		w.State = StateBacklog
		if w.Attempts >= maxAttempts {
			w.State, w.AvailableAt = StateWaiting, nil
		}
		return w, err
	})
	if err != nil {
		return nil, fmt.Errorf("listing outbox rows: %w", err)
	}
	return out, nil
}

// ParkExhausted parks rows that used up their attempts without a recorded
// failure (see parkExhausted) and returns how many.
func ParkExhausted(ctx context.Context, db DB, maxAttempts int, now *time.Time) (int, error) {
	tag, err := db.Exec(ctx, parkExhausted, maxAttempts, now)
	if err != nil {
		return 0, fmt.Errorf("parking outbox rows: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// Queued is an outbox row as the operators' show lists it: a notification
// a receipt's handler queued.
type Queued struct {
	ID            int64           `json:"id"`
	AggregateType string          `json:"aggregate_type"`
	AggregateID   string          `json:"aggregate_id"`
	EventType     string          `json:"event_type"`
	Payload       json.RawMessage `json:"payload"`
	CreatedAt     time.Time       `json:"created_at"`
	PublishedAt   *time.Time      `json:"published_at,omitempty"`
}

// QueuedBy returns the rows the handlers queued for the event eventID (its
// id is in each payload, as event_id), in the order they were queued.
func QueuedBy(ctx context.Context, db DB, eventID string) ([]Queued, error) {
	rows, err := db.Query(ctx, queuedBy, eventID)
	if err != nil {
		return nil, fmt.Errorf("reading the outbox rows of %s: %w", eventID, err)
	}
	qs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Queued, error) {
		var q Queued
		return q, r.Scan(&q.ID, &q.AggregateType, &q.AggregateID, &q.EventType, &q.Payload, &q.CreatedAt, &q.PublishedAt)
	})
	if err != nil {
		return nil, fmt.Errorf("reading the outbox rows of %s: %w", eventID, err)
	}
	return qs, nil
}
