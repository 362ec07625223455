// Package inbox is the webhook_inbox table: storing a verified receipt,
// claiming receipts for processing, recording their outcome, reading the
// backlog, the purge's batches (purge.go), and what operators read and
// retry (ops.go). All of the table's SQL lives in queries.go and, for
// operators, opsqueries.go; no other package writes SQL on it (tests aside).
//
// A receipt in the inbox is our promise to Stripe: once Store has committed it
// and the webhook has answered 2xx, Stripe stops retrying and the
// responsibility for processing it exactly once moves to the worker.
package inbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/stripe-inbox/inbox/internal/stripeevent"
)

// ProviderStripe is the provider column for Stripe receipts.
const ProviderStripe = "stripe"

// DB is what the inbox needs from a pool, a connection or a transaction.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Key identifies one receipt.
type Key struct {
	Provider string
	Endpoint string
	EventID  string
}

// StoreOutcome says what Store did.
type StoreOutcome string

const (
	// Stored: a new receipt was committed.
	Stored StoreOutcome = "stored"
	// Replaced: the reconciler had stored the event first and the receipt
	// was unprocessed; the endpoint's delivery replaced the listed copy
	// (storeDelivery in queries.go).
	Replaced StoreOutcome = "replaced"
	// Duplicate: a receipt with the same key was already committed (and,
	// for a delivery, it was the endpoint's own or already processed).
	Duplicate StoreOutcome = "duplicate"
)

// Store commits a receipt for an event the endpoint delivered (signature
// verified). The single INSERT ... ON CONFLICT DO UPDATE (storeDelivery)
// runs as its own transaction: when it returns nil the row is durable,
// whether it was new, replaced a copy the reconciler listed first, or was a
// duplicate. A concurrent delivery of the same event waits on the primary
// key until the first insert commits (Duplicate) or rolls back (Stored); a
// delivery of a listed receipt a worker is processing waits for the
// worker's transaction (see storeDelivery).
//
// No event is refused for its content (see jsonb.go): when jsonb cannot hold
// the event's text, payload gets a repaired copy and payload_raw the exact
// bytes. Should PostgreSQL still refuse the repaired text (a case jsonbText
// does not know), the INSERT is repeated once with a marker as payload; the
// first attempt failed as a whole, so exactly one INSERT commits. db must
// therefore be a pool or a connection, not a transaction.
func Store(ctx context.Context, db DB, endpoint string, ev stripeevent.Event) (StoreOutcome, error) {
	return storeWith(ctx, db, storeDelivery, SourceWebhook, endpoint, ev)
}

// Source says who stored a receipt (column source).
type Source string

const (
	// SourceWebhook: Stripe delivered the event to the webhook.
	SourceWebhook Source = "webhook"
	// SourceReconcile: the reconciler found the event on Stripe's Events API
	// before any delivery reached the webhook.
	SourceReconcile Source = "reconcile"
	// SourceEventBridge: Stripe delivered the event to Amazon EventBridge
	// (an event destination of type amazon_eventbridge) and the ingest
	// function stored it (internal/ingest). It is the endpoint's own
	// delivery, as the webhook's is.
	SourceEventBridge Source = "eventbridge"
)

// StoreFrom is Store for a receipt that source found. SourceWebhook is
// Store; SourceEventBridge is Store with that source (the same statement:
// whichever of the two deliveries commits first is the receipt, the other
// is a Duplicate, and either replaces a listed copy). SourceReconcile (an event listed on Stripe's Events API) inserts
// the receipt only when the inbox does not have it (storeListed): an event
// the webhook stored is a Duplicate here, and a listed copy is replaced by
// the endpoint's delivery while it is unprocessed (Store).
func StoreFrom(ctx context.Context, db DB, source Source, endpoint string, ev stripeevent.Event) (StoreOutcome, error) {
	switch source {
	case SourceWebhook, SourceEventBridge:
		return storeWith(ctx, db, storeDelivery, source, endpoint, ev)
	case SourceReconcile:
		return storeWith(ctx, db, storeListed, source, endpoint, ev)
	}
	return "", fmt.Errorf("storing receipt %s/%s: unknown source %q", endpoint, ev.ID, source)
}

// StoreAndNotify is Store that also notifies resident workers listening on
// NotifyChannel when the receipt commits (a duplicate does not notify). The
// notification only wakes a worker early: a worker that misses it finds the
// receipt at its next poll.
func StoreAndNotify(ctx context.Context, db DB, endpoint string, ev stripeevent.Event) (StoreOutcome, error) {
	return storeWith(ctx, db, storeDeliveryNotify, SourceWebhook, endpoint, ev)
}

// CountDuplicate records on the receipt of eventID that the webhook
// answered one more delivery of it "duplicate". It is a statistic, best
// effort: it never waits for a row lock (a duplicate that arrives while a
// worker processes the receipt is not counted; counted is false then), and
// the webhook ignores its failure. A separate statement after the store's
// INSERT ... DO NOTHING, so the store itself is unchanged.
func CountDuplicate(ctx context.Context, db DB, endpoint, eventID string) (counted bool, err error) {
	err = db.QueryRow(ctx, countDuplicate, ProviderStripe, endpoint, eventID).Scan(&counted)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("counting a duplicate of %s/%s: %w", endpoint, eventID, err)
	}
	return counted, nil
}

func storeWith(ctx context.Context, db DB, query string, source Source, endpoint string, ev stripeevent.Event) (StoreOutcome, error) {
	payload, repaired := jsonbText(ev.Payload)
	var raw []byte
	if repaired {
		raw = ev.Payload
	}
	outcome, err := store(ctx, db, query, source, endpoint, ev, payload, raw)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && refusedContent(pgErr.Code) {
		outcome, err = store(ctx, db, query, source, endpoint, ev, rawOnlyMarker(ev.ID, ev.Type), ev.Payload)
	}
	if err != nil {
		return "", fmt.Errorf("storing receipt %s/%s: %w", endpoint, ev.ID, err)
	}
	return outcome, nil
}

// store runs one of the store statements; each returns no row for a
// duplicate and else whether it replaced a listed copy (the notifying one
// a second column, scanned and dropped).
func store(ctx context.Context, db DB, query string, source Source, endpoint string, ev stripeevent.Event, payload, raw []byte) (StoreOutcome, error) {
	var replaced bool
	var notified *bool
	var signedAt *time.Time
	if !ev.SignedAt.IsZero() {
		signedAt = &ev.SignedAt
	}
	dest := []any{&replaced}
	if query == storeDeliveryNotify {
		dest = append(dest, &notified)
	}
	err := db.QueryRow(ctx, query,
		ProviderStripe, endpoint, ev.ID, ev.Type,
		nullable(ev.APIVersion), ev.Livemode, nullable(ev.Account), nullable(ev.ObjectID),
		string(payload), raw, nullable(ev.SecretFingerprint), signedAt, string(source),
	).Scan(dest...)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Duplicate, nil
	case err != nil:
		return "", err
	case replaced:
		return Replaced, nil
	}
	return Stored, nil
}

// refusedContent reports whether code is PostgreSQL refusing a value's
// content: class 22 (data exception: invalid text, untranslatable character,
// numeric out of range, ...) or 54001 (nesting too deep for the parser).
func refusedContent(code string) bool {
	return strings.HasPrefix(code, "22") || code == "54001"
}

// nullable maps "" to NULL. The text columns get the strings Go decoded from
// the event, where an escaped \u0000 becomes a NUL byte that PostgreSQL's
// text refuses; it is replaced by U+FFFD (these columns are for operators;
// the payload keeps the exact value).
func nullable(s string) *string {
	if s == "" {
		return nil
	}
	s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	return &s
}
