package inbox

// Operator reads of webhook_inbox and the operator's retry (internal/ops,
// cmd/inboxctl, functions/ops). The SQL is in opsqueries.go.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// Receipt states an operator filters by. They are not stored: they follow
// from processed_at, attempts (against MAX_ATTEMPTS) and last_error.
const (
	// StateBacklog: unprocessed and below the attempt limit (what the
	// BacklogCount metric counts), including receipts waiting for a retry.
	StateBacklog = "backlog"
	// StateFailed: the part of the backlog whose last attempt failed.
	StateFailed = "failed"
	// StateNeedsReview: unprocessed and at the attempt limit; no longer
	// retried until an operator retries it.
	StateNeedsReview = "needs-review"
	// StateProcessed: the effect committed (outcome applied, ignored or
	// ignored_other_mode).
	StateProcessed = "processed"
)

// States are the valid Filter.State values.
var States = []string{StateBacklog, StateFailed, StateNeedsReview, StateProcessed}

// Filter selects receipts. Empty fields match everything. MaxAttempts is
// the worker's MAX_ATTEMPTS: it separates the backlog from needs-review.
type Filter struct {
	Endpoint    string
	EventType   string
	EventID     string
	State       string
	ErrorText   string // a case-insensitive substring of last_error
	Since       *time.Time
	Until       *time.Time // exclusive
	MaxAttempts int
}

func (f Filter) args() []any {
	return []any{nullable(f.Endpoint), nullable(f.EventType), nullable(f.State), nullable(f.ErrorText),
		f.Since, f.Until, f.MaxAttempts, nullable(f.EventID)}
}

// ErrBadFilter is a filter the queries cannot run. internal/ops checks
// requests before they get here; this guards the package edge.
var ErrBadFilter = errors.New("invalid receipt filter")

func (f Filter) check() error {
	if f.MaxAttempts < 1 {
		return fmt.Errorf("%w: MaxAttempts %d", ErrBadFilter, f.MaxAttempts)
	}
	switch f.State {
	case "", StateBacklog, StateFailed, StateNeedsReview, StateProcessed:
	default:
		return fmt.Errorf("%w: state %q", ErrBadFilter, f.State)
	}
	return nil
}

// Receipt is a receipt as an operator sees it.
type Receipt struct {
	Endpoint   string     `json:"endpoint"`
	EventID    string     `json:"event_id"`
	EventType  string     `json:"event_type"`
	State      string     `json:"state"`
	APIVersion string     `json:"api_version,omitempty"`
	Livemode   bool       `json:"livemode"`
	Account    string     `json:"account,omitempty"`
	ObjectID   string     `json:"object_id,omitempty"`
	ReceivedAt time.Time  `json:"received_at"`
	SignedAt   *time.Time `json:"signed_at,omitempty"`
	// AvailableAt is when a worker may next claim it; nil while it waits
	// for review (available_at = 'infinity') or once processed.
	AvailableAt       *time.Time `json:"available_at,omitempty"`
	Attempts          int        `json:"attempts"`
	LastError         string     `json:"last_error,omitempty"`
	ProcessedAt       *time.Time `json:"processed_at,omitempty"`
	Outcome           string     `json:"outcome,omitempty"`
	SecretFingerprint string     `json:"secret_fingerprint,omitempty"`
	Duplicates        int        `json:"duplicates"`
	// Source is who stored it: "webhook" (a delivery) or "reconcile" (the
	// reconciler found it on the Events API; the webhook never delivered it).
	Source string `json:"source"`
	// ListedFirst: the reconciler stored it before the endpoint's delivery
	// arrived (with source "webhook", the delivery then replaced the
	// listed copy; migrations/0014_listed_first.sql).
	ListedFirst bool `json:"listed_first"`
	// Payload is the event as stored, only when asked for: the exact bytes
	// when they are JSON in valid UTF-8, else PayloadText (with invalid
	// bytes replaced).
	Payload     json.RawMessage `json:"payload,omitempty"`
	PayloadText string          `json:"payload_text,omitempty"`
}

func scanReceipt(r pgx.CollectableRow) (Receipt, error) {
	var (
		x       Receipt
		payload []byte
	)
	err := r.Scan(&x.Endpoint, &x.EventID, &x.EventType, &x.State, &x.APIVersion, &x.Livemode, &x.Account, &x.ObjectID,
		&x.ReceivedAt, &x.SignedAt, &x.AvailableAt, &x.Attempts, &x.LastError, &x.ProcessedAt, &x.Outcome,
		&x.SecretFingerprint, &x.Duplicates, &x.Source, &x.ListedFirst, &payload)
	if payload != nil {
		if utf8.Valid(payload) && json.Valid(payload) {
			x.Payload = json.RawMessage(payload)
		} else {
			x.PayloadText = strings.ToValidUTF8(string(payload), "\uFFFD")
		}
	}
	return x, err
}

// PageKey is where a page of receipts (newest first) continues: after the
// last receipt of the previous page.
type PageKey struct {
	ReceivedAt time.Time `json:"r"`
	Endpoint   string    `json:"e"`
	EventID    string    `json:"i"`
}

// ListReceipts returns up to limit receipts matching f, newest first,
// starting after after (nil: from the newest).
func ListReceipts(ctx context.Context, db DB, f Filter, after *PageKey, limit int) ([]Receipt, error) {
	if err := f.check(); err != nil {
		return nil, err
	}
	var at *time.Time
	var ep, id *string
	if after != nil {
		at, ep, id = &after.ReceivedAt, &after.Endpoint, &after.EventID
	}
	rows, err := db.Query(ctx, listReceipts, append(f.args(), at, ep, id, limit)...)
	if err != nil {
		return nil, fmt.Errorf("listing receipts: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanReceipt)
	if err != nil {
		return nil, fmt.Errorf("listing receipts: %w", err)
	}
	return out, nil
}

// ReceiptsByEventID returns the receipts of eventID (one per endpoint that
// received it; only endpoint's when endpoint is not empty), with their
// payloads when withPayload is true.
func ReceiptsByEventID(ctx context.Context, db DB, eventID, endpoint string, maxAttempts int, withPayload bool) ([]Receipt, error) {
	rows, err := db.Query(ctx, receiptsByEventID, eventID, nullable(endpoint), maxAttempts, withPayload)
	if err != nil {
		return nil, fmt.Errorf("reading receipt %s: %w", eventID, err)
	}
	out, err := pgx.CollectRows(rows, scanReceipt)
	if err != nil {
		return nil, fmt.Errorf("reading receipt %s: %w", eventID, err)
	}
	return out, nil
}

// Retry gives the unprocessed receipts matching f a fresh count (attempts
// 0) and makes them claimable now, in one statement, and returns their keys.
// Processed receipts are never touched, nor receipts a worker holds right
// now (RetrySkipped lists those). With dryRun it changes nothing and
// returns the keys it would change.
func Retry(ctx context.Context, db DB, f Filter, dryRun bool) ([]Key, error) {
	if err := f.check(); err != nil {
		return nil, err
	}
	if f.State == StateProcessed {
		return nil, fmt.Errorf("%w: processed receipts cannot be retried", ErrBadFilter)
	}
	q := retryReceipts
	if dryRun {
		q = retryCandidates
	}
	rows, err := db.Query(ctx, q, f.args()...)
	if err != nil {
		return nil, fmt.Errorf("retrying receipts: %w", err)
	}
	keys, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Key, error) {
		k := Key{Provider: ProviderStripe}
		return k, r.Scan(&k.Endpoint, &k.EventID)
	})
	if err != nil {
		return nil, fmt.Errorf("retrying receipts: %w", err)
	}
	return keys, nil
}

// Held is a receipt the retry skipped: a worker holds it (its claim's lease
// has not ended) or it waits out a failure's backoff, until Until.
type Held struct {
	Key
	Until time.Time
}

// RetrySkipped lists the unprocessed receipts matching f that Retry skips
// because a worker holds them right now (see heldNow in opsqueries.go).
// Run it after Retry, in its transaction.
func RetrySkipped(ctx context.Context, db DB, f Filter) ([]Held, error) {
	if err := f.check(); err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, retrySkipped, f.args()...)
	if err != nil {
		return nil, fmt.Errorf("listing the receipts the retry skips: %w", err)
	}
	held, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Held, error) {
		h := Held{Key: Key{Provider: ProviderStripe}}
		return h, r.Scan(&h.Endpoint, &h.EventID, &h.Until)
	})
	if err != nil {
		return nil, fmt.Errorf("listing the receipts the retry skips: %w", err)
	}
	return held, nil
}

// TypeCount is how many receipts of a type arrived in a window, and how
// many duplicate deliveries of them the webhook answered.
type TypeCount struct {
	EventType  string `json:"event_type"`
	Receipts   int    `json:"receipts"`
	Duplicates int    `json:"duplicates"`
}

// SourceCount is how many receipts one source stored.
type SourceCount struct {
	Source   string `json:"source"`
	Receipts int    `json:"receipts"`
}

// SourcesSince counts the receipts received since since, per source (who
// stored them: webhook, eventbridge or reconcile).
func SourcesSince(ctx context.Context, db DB, since time.Time) ([]SourceCount, error) {
	rows, err := db.Query(ctx, sourcesSince, since)
	if err != nil {
		return nil, fmt.Errorf("counting receipts per source: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (SourceCount, error) {
		var c SourceCount
		return c, r.Scan(&c.Source, &c.Receipts)
	})
	if err != nil {
		return nil, fmt.Errorf("counting receipts per source: %w", err)
	}
	return out, nil
}

// TypesSince counts the receipts received since since, per type.
func TypesSince(ctx context.Context, db DB, since time.Time) ([]TypeCount, error) {
	rows, err := db.Query(ctx, typesSince, since)
	if err != nil {
		return nil, fmt.Errorf("counting receipts per type: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (TypeCount, error) {
		var t TypeCount
		return t, r.Scan(&t.EventType, &t.Receipts, &t.Duplicates)
	})
	if err != nil {
		return nil, fmt.Errorf("counting receipts per type: %w", err)
	}
	return out, nil
}

// Latency is receipt-to-effect (processed_at - received_at) of the
// receipts processed in a window, in seconds.
type Latency struct {
	Processed int     `json:"processed"`
	P50       float64 `json:"p50_seconds"`
	P99       float64 `json:"p99_seconds"`
	Max       float64 `json:"max_seconds"`
}

// LatencySince measures the receipts processed since since.
func LatencySince(ctx context.Context, db DB, since time.Time) (Latency, error) {
	var l Latency
	if err := db.QueryRow(ctx, latencySince, since).Scan(&l.Processed, &l.P50, &l.P99, &l.Max); err != nil {
		return l, fmt.Errorf("measuring receipt-to-effect latency: %w", err)
	}
	return l, nil
}

// VersionCount is how many receipts of an API version an endpoint received
// in a window.
type VersionCount struct {
	Endpoint   string    `json:"endpoint"`
	APIVersion string    `json:"api_version"` // "" for events without one
	Receipts   int       `json:"receipts"`
	Last       time.Time `json:"last_received_at"`
}

// VersionsSince counts the receipts received since since, per endpoint and
// API version.
func VersionsSince(ctx context.Context, db DB, since time.Time) ([]VersionCount, error) {
	rows, err := db.Query(ctx, versionsSince, since)
	if err != nil {
		return nil, fmt.Errorf("counting API versions: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (VersionCount, error) {
		var v VersionCount
		return v, r.Scan(&v.Endpoint, &v.APIVersion, &v.Receipts, &v.Last)
	})
	if err != nil {
		return nil, fmt.Errorf("counting API versions: %w", err)
	}
	return out, nil
}

// SecretUse is how many deliveries to an endpoint one signing secret (by
// its fingerprint) verified in a window.
type SecretUse struct {
	Endpoint string `json:"endpoint"`
	// Fingerprint is stripeevent.Fingerprint of the secret; "" for receipts
	// stored before the webhook recorded it.
	Fingerprint string    `json:"fingerprint"`
	Receipts    int       `json:"receipts"`
	First       time.Time `json:"first_received_at"`
	Last        time.Time `json:"last_received_at"`
}

// SecretsSince counts the receipts received since since, per endpoint and
// matching secret.
func SecretsSince(ctx context.Context, db DB, since time.Time) ([]SecretUse, error) {
	rows, err := db.Query(ctx, secretsSince, since)
	if err != nil {
		return nil, fmt.Errorf("counting secret matches: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (SecretUse, error) {
		var s SecretUse
		return s, r.Scan(&s.Endpoint, &s.Fingerprint, &s.Receipts, &s.First, &s.Last)
	})
	if err != nil {
		return nil, fmt.Errorf("counting secret matches: %w", err)
	}
	return out, nil
}
