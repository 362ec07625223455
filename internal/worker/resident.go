package worker

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/metrics"
)

// resident drains, and then, until stopAt (the deadline minus the margin)
// or the end of ctx, waits for something to claim and drains again.
//
// Waiting costs one connection, not one per drainer: a single poller asks
// the claim's index whether anything is claimable (inbox.Claimable, an
// index probe that locks and writes nothing) every PollInterval, and only
// then starts a round of drainers (one, more when the backlog exceeds a
// claim; see round). With Listen, a listener on a connection of its own
// wakes the loop as soon as a receipt commits (the webhook's NOTIFY), and
// the round starts at once. Polling stays the guarantee: a notification that
// is lost (the listener reconnecting, the webhook not notifying) costs at
// most PollInterval.
//
// Claims that are held but not started when stopAt passes are given back
// by the drainers (inbox.Release, fenced by the attempt count), as in a
// scheduled run.
func (w *Worker) resident(ctx context.Context, stopAt time.Time, acc *runAcc) {
	expired := func() bool { return !stopAt.IsZero() && !time.Now().Before(stopAt) }
	since := time.Now()
	w.logger.InfoContext(ctx, "worker resident", "poll_interval", w.cfg.PollInterval.String(), "listen", w.cfg.Listen, "stop_at", stopAt)

	wake := make(chan struct{}, 1)
	var l listenState
	lctx, stopListening := context.WithCancel(ctx)
	var lwg sync.WaitGroup
	defer func() {
		stopListening()
		lwg.Wait()
		// The polling interval's log line: the coverage a run gave (from
		// the start of the invocation to stopAt, or its end).
		w.logger.InfoContext(ctx, "worker resident stopped", "resident_from", since, "resident_until", time.Now())
	}()
	if w.cfg.Listen {
		lwg.Add(1)
		go func() {
			defer lwg.Done()
			w.listen(lctx, wake, &l)
		}()
	}

	var (
		loggedAt time.Time // the last "polling for receipts failed" record
		unlogged int       // failed polls since
	)
	lastFlush := time.Now()
	var roundAfter int64 // the LISTENs registered before the last woken round
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		w.round(ctx, stopAt, false, acc)
		w.kickRelay()
		if time.Since(lastFlush) >= latencyFlushEvery {
			w.flushLatency(ctx)
			lastFlush = time.Now()
		}
		// Wait for a notification, or poll, until there is something to
		// claim.
		for {
			if expired() || ctx.Err() != nil {
				return
			}
			wait := w.cfg.PollInterval
			if !stopAt.IsZero() {
				wait = min(wait, time.Until(stopAt))
			}
			woken := false
			select {
			case <-wake:
				woken = true
			default:
				// "listening" says that the LISTEN in place now was in
				// place before a round that has run: only a notification
				// or a poll starts the next round.
				w.logger.DebugContext(ctx, "worker idle", "listening", l.caughtUp(roundAfter))
				timer.Reset(wait)
				select {
				case <-ctx.Done():
					return
				case <-wake:
					woken = true
				case <-timer.C:
				}
				timer.Stop() // Go 1.23+: no stale tick is left in timer.C
			}
			if expired() || ctx.Err() != nil {
				return
			}
			if woken {
				// Read after the wake-up: a LISTEN it announces is
				// counted, and the round below starts after it.
				roundAfter = l.registered.Load()
				break // the claim is the check
			}
			found, err := w.claimable(ctx, stopAt)
			if err != nil {
				if expired() || ctx.Err() != nil {
					return // the run ended while polling: not a failure
				}
				// Counted (PollErrors) and logged at most every
				// pollErrorLogEvery, with the number of failures since the
				// last record: not a record every PollInterval while the
				// database is away. The run goes on (see Run).
				acc.add(Summary{}, err)
				unlogged++
				if loggedAt.IsZero() || time.Since(loggedAt) >= pollErrorLogEvery {
					w.logger.WarnContext(ctx, "polling for receipts failed", "error", err, "failures", unlogged)
					loggedAt, unlogged = time.Now(), 0
				}
				continue
			}
			acc.succeeded()
			if found {
				break
			}
		}
	}
}

// pollErrorLogEvery is how often, at most, a resident worker whose polls
// keep failing logs it.
const pollErrorLogEvery = 10 * time.Second

// claimable is one poll, on a connection from the pool (the one the last
// round's drainer gave back, usually). The server ends it after
// StatementTimeout (a poll waiting on a lock held on webhook_inbox, say by
// a migration, fails and the connection stays usable), and it ends at
// stopAt at the latest, so a poll that hangs cannot keep the run past its
// margin (see boundedCtx).
func (w *Worker) claimable(ctx context.Context, stopAt time.Time) (bool, error) {
	pctx, cancel := w.boundedCtx(ctx, stopAt)
	defer cancel()
	return inbox.Claimable(pctx, w.pool, w.cfg.MaxAttempts, w.Now(), w.cfg.StatementTimeout)
}

// listen keeps a LISTEN on inbox.NotifyChannel until ctx ends, and signals
// wake (without blocking: one pending wake is enough) for each notification.
// The connection is taken out of the pool for good (it must not go back with
// a LISTEN registered) and closed at the end. When it fails, it logs, lets
// polling carry on, and tries again after a pause.
func (w *Worker) listen(ctx context.Context, wake chan<- struct{}, l *listenState) {
	signal := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	for ctx.Err() == nil {
		err := w.listenOnce(ctx, signal, l)
		l.listening.Store(false)
		if ctx.Err() != nil {
			return
		}
		w.logger.WarnContext(ctx, "listening for receipts failed; polling every POLL_INTERVAL until it listens again", "error", err)
		pause := time.NewTimer(max(w.cfg.PollInterval, time.Second))
		select {
		case <-ctx.Done():
		case <-pause.C:
		}
		pause.Stop()
	}
}

// listenState is what the listener tells the loop (for its "worker idle"
// records): whether a LISTEN is in place, and how many have been
// registered.
type listenState struct {
	listening  atomic.Bool
	registered atomic.Int64
}

// caughtUp reports whether a LISTEN is in place and was registered before
// the last round the listener woke (whose count of registrations, read
// after that wake-up, is roundAfter): then nothing stored before the LISTEN
// is left to find.
func (l *listenState) caughtUp(roundAfter int64) bool {
	return l.listening.Load() && roundAfter > 0 && roundAfter == l.registered.Load()
}

func (w *Worker) listenOnce(ctx context.Context, signal func(), l *listenState) error {
	pc, err := w.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	conn := pc.Hijack()
	defer conn.Close(context.WithoutCancel(ctx)) //nolint:errcheck // closing a listener we are done with
	if err := inbox.Listen(ctx, conn); err != nil {
		return err
	}
	// A receipt stored between the last claim and the LISTEN sent its
	// notification to nobody: look once now. Counted before the wake-up,
	// so the loop reads the count when it takes it (see resident).
	l.registered.Add(1)
	l.listening.Store(true)
	signal()
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		signal()
	}
}

// closeIdleConns closes the pool's idle connections at the end of a
// resident run. A Lambda execution environment is frozen between
// invocations, and with invocations overlapping every environment is
// only used every other minute: connections kept in its pool would hold
// pinned RDS Proxy sessions (and so database connections) the whole time
// for nothing. The next invocation opens what it needs.
func (w *Worker) closeIdleConns(ctx context.Context) {
	for _, c := range w.pool.AcquireAllIdle(ctx) {
		_ = c.Hijack().Close(ctx)
	}
}

// latencyFlushEvery is how often a resident worker writes the latencies it
// has collected (also whenever it has metrics.MaxValues of them, and at
// the end of the run).
const latencyFlushEvery = 10 * time.Second

// latencyRecorder collects receipt-to-effect latencies (processed_at -
// received_at) of the receipts marked processed in committed transactions.
type latencyRecorder struct {
	mu     sync.Mutex
	values []float64
}

// add records ds and returns a full line's worth of values to write, if it
// has that many.
func (r *latencyRecorder) add(ds ...time.Duration) []float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range ds {
		r.values = append(r.values, d.Seconds())
	}
	if len(r.values) < metrics.MaxValues {
		return nil
	}
	out := r.values[:metrics.MaxValues:metrics.MaxValues]
	r.values = append([]float64(nil), r.values[metrics.MaxValues:]...)
	return out
}

func (r *latencyRecorder) take() []float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.values
	r.values = nil
	return out
}

// recordLatency records the latencies of receipts whose processing
// transaction committed, writing a metric line whenever a full one is
// collected.
func (w *Worker) recordLatency(ds ...time.Duration) {
	if full := w.latency.add(ds...); full != nil {
		w.emitLatency(context.Background(), full)
	}
}

// flushLatency writes every latency collected so far.
func (w *Worker) flushLatency(ctx context.Context) {
	vs := w.latency.take()
	for len(vs) > 0 {
		n := min(len(vs), metrics.MaxValues)
		w.emitLatency(ctx, vs[:n])
		vs = vs[n:]
	}
}

// emitLatency writes ReceiptToEffectSeconds, one value per receipt (EMF
// values array), so CloudWatch's percentiles (p50, p99) are over receipts.
func (w *Worker) emitLatency(ctx context.Context, vs []float64) {
	if err := w.metrics.Emit(nil, metrics.Metric{Name: "ReceiptToEffectSeconds", Values: vs, Unit: metrics.Seconds}); err != nil {
		w.logger.ErrorContext(ctx, "writing metrics", "error", err)
	}
}
