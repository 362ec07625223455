package worker

import (
	"context"
	"fmt"
	"runtime/debug"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/inbox"
)

// apply is the body of Process (one receipt per transaction): lock,
// re-check, handle, mark. It also returns the receipt-to-effect latency of a
// receipt it marked processed (0 otherwise), to be recorded once tx
// commits. ProcessBatch does the same for many receipts at once (batch.go).
func (w *Worker) apply(ctx context.Context, tx pgx.Tx, c inbox.Claimed) (Outcome, bool, time.Duration, error) {
	locked, found, err := inbox.Lock(ctx, tx, c.Key)
	if err != nil {
		return "", false, 0, err
	}
	if !found {
		return AlreadyDone, false, 0, nil
	}
	if !w.books(locked) {
		lat, err := inbox.MarkProcessed(ctx, tx, c.Key, string(IgnoredOtherMode), w.Now())
		if err != nil {
			return "", false, 0, err
		}
		return IgnoredOtherMode, false, lat, nil
	}
	res, err := applyHandler(ctx, w.handlers, tx, event(c, locked))
	if err != nil {
		return "", false, 0, err
	}
	lat, err := inbox.MarkProcessed(ctx, tx, c.Key, string(res.Outcome), w.Now())
	if err != nil {
		return "", false, 0, err
	}
	return Outcome(res.Outcome), res.Anomaly, lat, nil
}

// books reports whether the receipt is of the Stripe mode this worker books.
// A receipt of the other mode is marked processed as ignored_other_mode and
// never reaches a handler, so it cannot touch invoices, the ledger or the
// outbox.
func (w *Worker) books(l inbox.Locked) bool {
	return l.Livemode == (w.cfg.Mode == ModeLive)
}

// event is what a handler sees of a locked receipt.
func event(c inbox.Claimed, l inbox.Locked) handlers.Event {
	return handlers.Event{ID: c.EventID, Type: l.EventType, Endpoint: c.Endpoint, Payload: l.Payload, Livemode: l.Livemode, Account: l.Account}
}

// applyHandler runs the handler for ev. A panic in it is returned as a
// *panicError, so that it fails only this receipt: re-raised, it would end
// the process (the drainer goroutines are not the Lambda runtime's, which
// does not recover them) and lose every drainer's work in flight.
func applyHandler(ctx context.Context, reg handlers.Registry, db handlers.DB, ev handlers.Event) (res handlers.Result, err error) {
	defer func() {
		if p := recover(); p != nil {
			res, err = handlers.Result{}, &panicError{value: p, stack: debug.Stack()}
		}
	}()
	return reg.Apply(ctx, db, ev)
}

// panicError is a handler's panic: its value and the stack where it
// happened.
type panicError struct {
	value any
	stack []byte
}

func (e *panicError) Error() string {
	// From the frame that panicked: the frames above it (debug.Stack, the
	// deferred function, panic itself) say nothing about the cause.
	stack := string(e.stack)
	if i := strings.Index(stack, "\npanic("); i >= 0 {
		rest := stack[i+1:]
		for range 2 { // the panic( line and its file:line
			if j := strings.IndexByte(rest, '\n'); j >= 0 {
				rest = rest[j+1:]
			}
		}
		stack = rest
	}
	return fmt.Sprintf("%v\n%s", e.value, stack)
}
