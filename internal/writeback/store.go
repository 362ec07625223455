package writeback

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Intent is a claimed write-back.
type Intent struct {
	ID       int64           `json:"id"`
	Kind     string          `json:"kind"`
	Target   string          `json:"target"`
	Params   json.RawMessage `json:"params"`
	Key      string          `json:"idempotency_key"`
	Attempts int             `json:"attempts"` // this one included
	// ReadBackFirst: the first attempt was made longer ago than the key
	// lifetime, so Stripe may have forgotten the key.
	ReadBackFirst bool `json:"read_back_first"`
	// Superseded: a newer intent of the same kind and target is pending
	// (in this batch or not) or done: sending this one would undo it.
	Superseded bool `json:"superseded"`
}

// OutcomeKind is what happened to a claimed intent.
type OutcomeKind string

const (
	// Done: the result is recorded; never called again.
	Done OutcomeKind = "done"
	// Retry: an ambiguous failure (no answer, 5xx, 409): due again after
	// Delay, with the same key; the attempt counts.
	Retry OutcomeKind = "retry"
	// Release: throttled (429) or the key refused (401/403): due again
	// after Delay; the attempt does not count.
	Release OutcomeKind = "release"
	// Park: a 4xx retrying cannot fix; waits for a human.
	Park OutcomeKind = "park"
)

// Outcome is what to record for one intent, against the claim's token.
type Outcome struct {
	ID       int64           `json:"id"`
	Kind     OutcomeKind     `json:"kind"`
	Via      string          `json:"via,omitempty"` // Done: call, read_back or superseded
	ResultID string          `json:"result_id,omitempty"`
	Result   json.RawMessage `json:"result,omitempty"`
	Error    string          `json:"error,omitempty"`
	Delay    time.Duration   `json:"delay,omitempty"`
	// MayHaveRun (Park): an earlier request with the key ran (Stripe
	// answered idempotency_error), so the intent is parked as not refused
	// and an operator's retry keeps the key. False: Stripe refused the call
	// and changed nothing.
	MayHaveRun bool `json:"may_have_run,omitempty"`
}

// The ways a result is found (writeback_intents.result_via).
const (
	ViaCall       = "call"
	ViaReadBack   = "read_back"
	ViaSuperseded = "superseded"
)

// Store claims intents and records their outcomes: DBStore in the
// database's network (the local runner, the writebackstore function), or a
// RemoteStore that invokes the writebackstore function (the writeback
// function outside the VPC).
type Store interface {
	// Claim takes up to limit due intents under a fresh fencing token.
	Claim(ctx context.Context, limit int, lease, keyLifetime time.Duration) (token string, intents []Intent, err error)
	// Record records outcomes of intents claimed under token and returns
	// how many it recorded: an intent another claim owns now (this one's
	// lease ended) is left to it.
	Record(ctx context.Context, token string, maxAttempts int, outcomes []Outcome) (int, error)
}

// DB is a pool, a connection or a transaction.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// DBStore is the Store on the database. Now, when set, is the clock of its
// statements (tests); nil is the database's now().
type DBStore struct {
	DB  DB
	Now func() *time.Time
}

func (s DBStore) now() *time.Time {
	if s.Now == nil {
		return nil
	}
	return s.Now()
}

// Claim implements Store.
func (s DBStore) Claim(ctx context.Context, limit int, lease, keyLifetime time.Duration) (string, []Intent, error) {
	token, err := newToken()
	if err != nil {
		return "", nil, err
	}
	rows, err := s.DB.Query(ctx, claimIntents, s.now(), limit, lease.Seconds(), token, keyLifetime.Seconds())
	if err != nil {
		return "", nil, fmt.Errorf("claiming write-back intents: %w", err)
	}
	intents, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Intent, error) {
		var (
			in     Intent
			params string
		)
		err := r.Scan(&in.ID, &in.Kind, &in.Target, &params, &in.Key, &in.Attempts, &in.ReadBackFirst, &in.Superseded)
		in.Params = json.RawMessage(params)
		return in, err
	})
	if err != nil {
		return "", nil, fmt.Errorf("claiming write-back intents: %w", err)
	}
	return token, intents, nil
}

// Record implements Store.
func (s DBStore) Record(ctx context.Context, token string, maxAttempts int, outcomes []Outcome) (int, error) {
	n := 0
	for _, o := range outcomes {
		var (
			tag pgconn.CommandTag
			err error
		)
		switch o.Kind {
		case Done:
			result := o.Result
			if len(result) == 0 || !json.Valid(result) {
				result = json.RawMessage("null")
			}
			tag, err = s.DB.Exec(ctx, recordDone, o.ID, token, s.now(), o.ResultID, string(result), o.Via)
		case Retry, Release:
			tag, err = s.DB.Exec(ctx, recordRetry, o.ID, token, s.now(), o.Delay.Seconds(), o.Error, maxAttempts, o.Kind == Retry)
		case Park:
			tag, err = s.DB.Exec(ctx, recordParked, o.ID, token, o.Error, !o.MayHaveRun)
		default:
			return n, fmt.Errorf("write-back intent %d: unknown outcome %q", o.ID, o.Kind)
		}
		if err != nil {
			return n, fmt.Errorf("recording write-back intent %d (%s): %w", o.ID, o.Kind, err)
		}
		n += int(tag.RowsAffected())
	}
	return n, nil
}

// Backlog is what waits: pending intents, the age of the oldest since it
// was recorded, and parked intents.
type Backlog struct {
	Pending          int     `json:"pending"`
	OldestAgeSeconds float64 `json:"oldest_age_seconds"`
	Parked           int     `json:"parked"`
}

// ReadBacklog reads the backlog.
func ReadBacklog(ctx context.Context, db DB, now *time.Time) (Backlog, error) {
	var b Backlog
	if err := db.QueryRow(ctx, backlog, now).Scan(&b.Pending, &b.OldestAgeSeconds, &b.Parked); err != nil {
		return Backlog{}, fmt.Errorf("reading the write-back backlog: %w", err)
	}
	return b, nil
}

func newToken() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("making a fencing token: %w", err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16]), nil
}

// RetryParked makes a parked intent due now with a fresh count of attempts
// and reports whether it was parked.
func RetryParked(ctx context.Context, db DB, id int64) (bool, error) {
	rows, err := db.Query(ctx, retryParked, id)
	if err != nil {
		return false, fmt.Errorf("retrying write-back intent %d: %w", id, err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return false, fmt.Errorf("retrying write-back intent %d: %w", id, err)
	}
	return len(ids) == 1, nil
}

// PurgeDone deletes up to limit done intents recorded done strictly before
// cutoff (internal/retention's batch; see purgeDone) and returns how many.
func PurgeDone(ctx context.Context, db interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}, cutoff time.Time, limit int) (int64, error) {
	tag, err := db.Exec(ctx, purgeDone, cutoff, limit)
	if err != nil {
		return 0, fmt.Errorf("deleting done write-back intents: %w", err)
	}
	return tag.RowsAffected(), nil
}
