// Package inbox is the webhook_inbox table: storing a verified receipt,
// claiming receipts for processing, recording their outcome, and reading the
// backlog. All of the table's SQL lives in queries.go.
//
// A receipt in the inbox is our promise to Stripe: once Store has committed it
// and the webhook has answered 2xx, Stripe stops retrying and the
// responsibility for processing it exactly once moves to the worker.
package inbox

import (
	"context"
	"errors"
	"fmt"

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
	// Duplicate: a receipt with the same key was already committed.
	Duplicate StoreOutcome = "duplicate"
)

// Store commits a receipt for a verified event on endpoint. The single
// INSERT ... ON CONFLICT DO NOTHING runs as its own transaction: when it
// returns nil the row is durable, whether it was new or a duplicate. A
// concurrent delivery of the same event waits on the primary key until the
// first insert commits (Duplicate) or rolls back (Stored).
func Store(ctx context.Context, db DB, endpoint string, ev stripeevent.Event) (StoreOutcome, error) {
	var inserted bool
	err := db.QueryRow(ctx, storeReceipt,
		ProviderStripe, endpoint, ev.ID, ev.Type,
		nullable(ev.APIVersion), ev.Livemode, nullable(ev.Account), nullable(ev.ObjectID),
		string(ev.Payload),
	).Scan(&inserted)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Duplicate, nil
	case err != nil:
		return "", fmt.Errorf("storing receipt %s/%s: %w", endpoint, ev.ID, err)
	}
	return Stored, nil
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
