// Package handlers holds the business effects of Stripe events: idempotent
// state transitions on invoices, ledger bookings with unique business keys,
// and outbox rows written in the same transaction.
//
// Every handler runs inside the worker's processing transaction, together
// with the update that marks the receipt processed, so an effect and its
// receipt commit or roll back as one. Handlers must be correct when the same
// fact arrives twice (redelivery, or two Event objects), concurrently, and in
// any order. State changes never depend on an event's `created` timestamp:
// Stripe records it in seconds and says not to use it for ordering. Only an
// invoice's descriptive fields (customer, currency, amount_due) follow the
// newest snapshot by `created`, ties broken by status rank (see
// upsertInvoice). Money is booked only for events of the mode the deployment
// books (the worker filters on Event.Livemode), and refunds only once they
// have succeeded (see refunds.go).
package handlers

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is the transaction a handler runs in.
//
// In a batch, the worker runs each Booking as a job of internal/batch,
// which may send its first statement in one round trip with those of other
// receipts (each under its own savepoint) before it hands the Booking the
// result. So a handler uses DB only from its own goroutine, reads a row
// (Scan) or closes Rows before its next call, as with pgx, and keeps its
// statements in the transaction it is given (no COMMIT, ROLLBACK or
// savepoints of its own): batch.DB's rules.
//
// A handler may run more than once for one receipt: when a batch
// transaction fails (another receipt's handler broke it, the connection was
// lost), nothing of it commits and the worker runs each of its receipts'
// handlers again, one transaction each; a deadlock, or a lock wait past the
// lock timeout of the transaction of a batch's unplaced refunds, reruns one
// alone after it; a failure reruns it after a backoff. So a handler has no
// effects outside the database (no HTTP calls, no messages sent, no
// files): what must reach the outside world goes through the outbox, in the
// same transaction, and is sent only once it has committed.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Event is a stored receipt as a handler sees it.
type Event struct {
	ID       string
	Type     string
	Endpoint string
	Payload  []byte // the verified Stripe event JSON
	Livemode bool   // the event's livemode; the worker hands a handler only events of the mode it books
	Account  string // the connected account (acct_...) of a Connect event, "" for the platform's own
}

// Outcome says what a handler did.
type Outcome string

const (
	// Applied: the event's effect is now reflected (it may have been a no-op
	// because the effect was already there).
	Applied Outcome = "applied"
	// Ignored: the event type has no handler.
	Ignored Outcome = "ignored"
	// IgnoredOtherMode: the event is of the other Stripe mode than the one
	// the deployment books (say a connected account's test-mode event on a
	// live endpoint). The worker sets it without calling a handler.
	IgnoredOtherMode Outcome = "ignored_other_mode"
)

// Result is what a handler reports.
type Result struct {
	Outcome Outcome
	// Anomaly is set when the event raised (or re-raised) an anomaly row.
	Anomaly bool
}

// A Handler reads one event: it decodes the payload and checks its version
// and contract, without I/O, and returns the Booking that applies it. The
// worker reads each receipt of a batch before the batch runs the bookings,
// each on a goroutine of its own (internal/batch): decoding there, on a
// goroutine's small starting stack, cost the stack growths that
// encoding/json's recursion needs for every receipt (issue 24).
type Handler func(ev Event) Booking

// A Booking applies one event, read by its Handler, inside tx. A Handler
// that could not read its event returns a Booking that returns the error
// without a statement. A Booking may run more than once (a batch that
// rolls a receipt back runs it again, internal/batch): run again, it must
// book what it booked the first time, so it may not change what its
// Handler read (each one here sorts and fills in only lists it built or
// copied itself).
type Booking func(ctx context.Context, tx DB) (Result, error)

// HandlerFunc is a Handler that reads and applies in one step: a thin
// event, or a test's handler.
func HandlerFunc(apply func(ctx context.Context, tx DB, ev Event) (Result, error)) Handler {
	return func(ev Event) Booking {
		return func(ctx context.Context, tx DB) (Result, error) { return apply(ctx, tx, ev) }
	}
}

// ErrBadPayload means the event's data.object lacks what the handler needs.
// Retrying cannot help; the receipt uses up its attempts and waits for review.
var ErrBadPayload = errors.New("event payload is missing required fields")

// Registry maps event types to handlers.
type Registry map[string]Handler

// Default is New with the default options (unnamed releases are booked when
// their fields satisfy the contracts).
func Default() Registry { return New(Options{}) }

// New is the one place where handlers are registered. Each decodes its
// event once and checks its contract and version (on) before it applies.
func New(o Options) Registry {
	return Registry{
		"invoice.created":                 on(o, invoiceCreated),
		"invoice.finalized":               on(o, invoiceFinalized),
		"invoice.paid":                    on(o, o.invoicePaid),
		"invoice.voided":                  on(o, invoiceVoided),
		"invoice.marked_uncollectible":    on(o, invoiceMarkedUncollectible),
		"invoice_payment.paid":            on(o, invoicePaymentPaid),
		"charge.refunded":                 on(o, chargeRefunded),
		"refund.created":                  on(o, refundChanged),
		"refund.updated":                  on(o, refundChanged),
		"refund.failed":                   on(o, refundChanged),
		"charge.refund.updated":           on(o, refundChanged),
		"charge.dispute.created":          on(o, disputeChanged),
		"charge.dispute.updated":          on(o, disputeChanged),
		"charge.dispute.closed":           on(o, disputeChanged),
		"charge.dispute.funds_withdrawn":  on(o, disputeChanged),
		"charge.dispute.funds_reinstated": on(o, disputeChanged),
		// A thin event (no API version, no data.object): see thin.go.
		EventGenerationFailureResolved: HandlerFunc(eventGenerationFailureResolved),
	}
}

// on makes the Handler of an event whose data.object is a T: it decodes the
// payload once into T, checks the version against o and T's contract (see
// contract.go), and only if both hold does its Booking apply.
func on[T any, P contracted[T]](o Options, apply func(ctx context.Context, tx DB, ev Event, obj T, m Meta) (Result, error)) Handler {
	return func(ev Event) Booking {
		obj, m, err := decode[T, P](ev)
		if verr := o.admit(ev, m.APIVersion); verr != nil {
			return Failed(verr) // the version first: a shape is judged only in a version we admit
		}
		if err != nil {
			return Failed(err)
		}
		return func(ctx context.Context, tx DB) (Result, error) { return apply(ctx, tx, ev, obj, m) }
	}
}

// Failed is the Booking of an event its Handler could not read: it
// returns err without a statement.
func Failed(err error) Booking {
	return func(context.Context, DB) (Result, error) { return Result{}, err }
}

// Read reads ev with the handler for ev.Type. An event without one gets a
// Booking that reports Ignored.
func (r Registry) Read(ev Event) Booking {
	h, ok := r[ev.Type]
	if !ok {
		return func(context.Context, DB) (Result, error) { return Result{Outcome: Ignored}, nil }
	}
	return h(ev)
}

// Apply reads ev and applies it inside tx.
func (r Registry) Apply(ctx context.Context, tx DB, ev Event) (Result, error) {
	return r.Read(ev)(ctx, tx)
}
