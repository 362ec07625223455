package worker

import (
	"context"
	"sync"
	"time"
)

// Relay is the outbox relay (internal/outbox.Relay) that the worker runs
// when one is attached (SetRelay): PublishDue publishes what is due; final is the
// invocation's last call, which also reports the outbox's backlog.
//
// Where it runs, and why: the worker already runs in the VPC next to the
// database, every minute and resident for most of it, so the relay costs no
// extra function, schedule or connection pool, and an outbox row written by
// a receipt's handler is published right after the round that wrote it
// (the round kicks the relay), or within Every (2 s) when it came from
// elsewhere or had to wait: latency well under a minute, with nothing added
// to the bill but the EventBridge VPC endpoint and the PutEvents calls. It
// runs on its own goroutine, so a slow PutEvents never holds up the
// drainers or the poller.
type Relay interface {
	PublishDue(ctx context.Context, final bool) (published int, err error)
}

// SetRelay attaches the outbox relay: a resident run runs it after each
// round and every every while idle, and every run (resident or not) once at
// the end. Call it before the first Run.
func (w *Worker) SetRelay(r Relay, every time.Duration) {
	w.relay, w.relayEvery, w.relayKick = r, every, make(chan struct{}, 1)
}

// kickRelay asks the resident relay loop to run now (without blocking: one
// pending request is enough).
func (w *Worker) kickRelay() {
	if w.relay == nil {
		return
	}
	select {
	case w.relayKick <- struct{}{}:
	default:
	}
}

// startRelay starts the resident relay loop: it runs the relay when kicked
// and every relayEvery, until stop is called or stopAt. Each run ends by
// stopAt (rows not sent by then are given back uncounted). stop waits for
// the loop.
func (w *Worker) startRelay(ctx context.Context, stopAt time.Time, acc *runAcc) (stop func()) {
	if w.relay == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(w.relayEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			case <-w.relayKick:
			}
			if expired(stopAt) {
				return
			}
			rctx, cancel := ctx, context.CancelFunc(func() {})
			if !stopAt.IsZero() {
				rctx, cancel = context.WithDeadline(ctx, stopAt)
			}
			w.runRelay(rctx, false, acc)
			cancel()
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() { close(done) })
		wg.Wait()
	}
}

// finalRelay is the run's last relay run, after the drainers stopped: on a
// context that outlives a cancelled ctx and ends half the margin before
// ctx's deadline, leaving time for the backlog reads and the metrics.
func (w *Worker) finalRelay(ctx context.Context, acc *runAcc) {
	if w.relay == nil {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), statsTimeout)
	defer cancel()
	if d, ok := ctx.Deadline(); ok {
		var c2 context.CancelFunc
		rctx, c2 = context.WithDeadline(rctx, d.Add(-w.cfg.DeadlineMargin/2))
		defer c2()
	}
	w.runRelay(rctx, true, acc)
}

// runRelay runs the relay once and adds what it published to acc. Its
// errors are logged, not the run's: the receipts were processed, and the
// outbox's backlog metrics alarm when publishing falls behind.
func (w *Worker) runRelay(ctx context.Context, final bool, acc *runAcc) {
	n, err := w.relay.PublishDue(ctx, final)
	acc.mu.Lock()
	acc.total.OutboxPublished += n
	acc.mu.Unlock()
	if err != nil {
		w.logger.WarnContext(ctx, "outbox relay failed", "error", err)
	}
}
