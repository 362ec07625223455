// Package worker drains the inbox: it claims unprocessed receipts in short
// transactions and applies each one's business effect in a processing
// transaction that also marks it processed.
//
// The claim (inbox.Claim) counts the attempt and sets a lease, and commits on
// its own, so a process that dies while processing still uses up an attempt
// and a receipt that kills every worker stops at the attempt limit. The
// processing transaction locks the receipt's row (waiting, not skipping),
// re-checks that it is unprocessed, applies the handler and sets
// processed_at: the effect and the mark commit together or not at all, so a
// receipt whose lease expired and that another worker completed is a no-op
// when the first worker resumes.
//
// worker.go is the loop (Run, its rounds of drainers, their claims);
// apply.go is one receipt's transaction, top to bottom; resident.go keeps
// a worker polling until its deadline, relay.go runs the outbox relay
// between rounds, drift.go counts receipts of other API versions.
package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stripe-inbox/inbox/internal/batch"
	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/metrics"
)

// Worker drains the inbox.
type Worker struct {
	pool     *pgxpool.Pool
	handlers handlers.Registry
	cfg      Config
	logger   *slog.Logger
	metrics  *metrics.Emitter

	// Now returns the time to use for leases and backoff; nil means the
	// database's now(). Tests set it to move time without sleeping.
	Now func() *time.Time
	// Jitter returns a number in [0, 1); math/rand by default.
	Jitter func() float64

	latency *latencyRecorder

	// deadlocks counts the receipts rolled back because PostgreSQL chose
	// them as a deadlock's victim (Summary.Deadlocks, metric Deadlocks).
	deadlocks atomic.Int64
	// lockWaits counts the unplaced refunds that waited for a lock past
	// unplacedLockWait, and the receipts whose statement sent after those
	// of later invoices did past interleavedLockWait (see there).
	lockWaits atomic.Int64
	// shapes is what the drainers' batches learned of the event types
	// whose handlers take several statements (internal/batch).
	shapes batch.Shapes

	// The outbox relay, when attached (SetRelay; see relay.go).
	relay      Relay
	relayEvery time.Duration
	relayKick  chan struct{}
}

// New returns a Worker, as River's NewClient does: it fills cfg's zero
// fields with the defaults (WithDefaults), then validates it, and returns an
// error saying what to fix instead of a worker that would break a
// guarantee. em may be nil (no metrics).
func New(pool *pgxpool.Pool, reg handlers.Registry, cfg Config, logger *slog.Logger, em *metrics.Emitter) (*Worker, error) {
	cfg = cfg.WithDefaults()
	errs := []error{cfg.Validate()}
	if pool == nil {
		errs = append(errs, errors.New("no database pool"))
	}
	if reg == nil {
		errs = append(errs, errors.New("no handler registry (handlers.Default())"))
	}
	if logger == nil {
		errs = append(errs, errors.New("no logger"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("invalid worker configuration: %w", err)
	}
	return &Worker{pool: pool, handlers: reg, cfg: cfg, logger: logger, metrics: em, Now: func() *time.Time { return nil }, Jitter: rand.Float64, latency: &latencyRecorder{}}, nil
}

// Summary is what one Run did, and the backlog it left.
type Summary struct {
	Processed           int     `json:"processed"`
	Ignored             int     `json:"ignored"`
	IgnoredOtherMode    int     `json:"ignored_other_mode"`
	Failed              int     `json:"failed"`
	AlreadyDone         int     `json:"already_done"`
	Anomalies           int     `json:"anomalies"`
	Released            int     `json:"released"`
	Remaining           int     `json:"remaining"`
	OldestAgeSeconds    float64 `json:"oldest_unprocessed_age_seconds"`
	NeedsReview         int     `json:"needs_review"`
	UnresolvedAnomalies int     `json:"unresolved_anomalies"`
	DurationMs          int64   `json:"duration_ms"`
	// PollErrors counts the polls and claims of the run that failed (the
	// database unreachable for a moment, a lock on webhook_inbox past the
	// statement timeout). They do not fail the run unless none succeeded.
	PollErrors int `json:"poll_errors"`
	// Deadlocks counts the receipts PostgreSQL rolled back as a deadlock's
	// victim during the run (each is applied again; nothing is lost). Each
	// cost the other transaction deadlock_timeout (1 s): batches take rows
	// in one order so that this stays 0 (apply.go, lockOrder).
	Deadlocks int `json:"deadlocks"`
	// LockWaits counts the receipts of the run that waited for a lock past
	// the lock timeout of their statement (the refunds the claim could not
	// place, apply.go, unplacedLockWait; a statement a batch sent after
	// those of later invoices, interleavedLockWait) and were applied again
	// on their own: nothing is lost, each cost one transaction.
	LockWaits int `json:"lock_waits"`
	// UnexpectedAPIVersion counts the receipts claimed for the first time
	// whose API version is not Config.APIVersion (drift.go).
	UnexpectedAPIVersion int `json:"unexpected_api_version"`
	// OutboxPublished counts the outbox rows the relay published during
	// the run (when one is attached; see SetRelay).
	OutboxPublished int `json:"outbox_published,omitempty"`
}

func (s *Summary) add(o Outcome, anomaly bool) {
	switch o {
	case Applied:
		s.Processed++
	case Ignored:
		s.Ignored++
	case IgnoredOtherMode:
		s.IgnoredOtherMode++
	case AlreadyDone:
		s.AlreadyDone++
	case Failed:
		s.Failed++
	case Released:
		s.Released++
	}
	if anomaly {
		s.Anomalies++
	}
}

// Run drains until nothing is claimable or ctx's deadline is within the
// margin, then reads the backlog, emits metrics and returns the summary.
// With PollInterval > 0 the worker is resident: once drained, it keeps
// looking for receipts (and, with Listen, wakes on the webhook's
// notification) until the deadline minus the margin, draining again
// whenever there is something to claim (see resident).
// Errors of single receipts are recorded on them and do not fail the run; an
// error is returned only when the database cannot be used at all: when no
// poll and no claim of the run succeeded. Otherwise failed polls and claims
// are counted (Summary.PollErrors, metric PollErrors) and logged, and the
// run goes on: a resident run polls hundreds of times, and one that failed
// must not fail the invocation (and page).
func (w *Worker) Run(ctx context.Context) (Summary, error) {
	start := time.Now()
	deadlocksBefore, lockWaitsBefore := w.deadlocks.Load(), w.lockWaits.Load()
	stopAt := w.stopAt(ctx)

	acc := &runAcc{}
	if w.cfg.PollInterval > 0 {
		stopRelay := w.startRelay(ctx, stopAt, acc)
		w.resident(ctx, stopAt, acc)
		stopRelay()
	} else {
		w.round(ctx, stopAt, true, acc)
	}
	w.finalRelay(ctx, acc)
	total, errs, used := acc.total, acc.errs, acc.used
	if acc.failed > 0 {
		errs = append(errs, fmt.Errorf("and %d more errors", acc.failed))
	}

	statsCtx, cancel := w.statsCtx(ctx)
	defer cancel()
	// Receipts that reached the attempt limit before claims and failures
	// parked them (out of the claim's index range) are parked here.
	if parked, err := inbox.ParkNeedsReview(statsCtx, w.pool, w.cfg.MaxAttempts, w.Now()); err != nil {
		errs = append(errs, err)
	} else if parked > 0 {
		w.logger.InfoContext(ctx, "parked receipts that need review", "count", parked)
	}
	backlog, backlogErr := inbox.Stats(statsCtx, w.pool, w.cfg.MaxAttempts, w.Now())
	if backlogErr != nil {
		errs = append(errs, backlogErr)
	}
	unresolved, anomaliesErr := handlers.UnresolvedAnomalies(statsCtx, w.pool)
	if anomaliesErr != nil {
		errs = append(errs, anomaliesErr)
	}
	total.Remaining, total.OldestAgeSeconds, total.NeedsReview = backlog.Count, backlog.OldestAgeSeconds, backlog.NeedsReview
	total.UnresolvedAnomalies = unresolved
	total.DurationMs = time.Since(start).Milliseconds()
	total.Deadlocks = int(w.deadlocks.Load() - deadlocksBefore)
	total.LockWaits = int(w.lockWaits.Load() - lockWaitsBefore)

	// Whatever failed, emit what is known: the counts of this run always,
	// and each gauge that could be read. A gauge missing only when it could
	// not be read keeps one drainer's transient error from hiding the
	// backlog (the alarms treat missing data as breaching).
	w.flushLatency(ctx)
	w.emit(ctx, total, backlogErr == nil, anomaliesErr == nil)
	if w.cfg.PollInterval > 0 {
		w.closeIdleConns(statsCtx)
	}
	if err := errors.Join(errs...); err != nil && used {
		// The database was usable: what failed is counted and logged,
		// and the run is not a failure.
		w.logger.WarnContext(ctx, "worker run had errors", "poll_errors", total.PollErrors, "error", err)
		return total, nil
	}
	return total, errors.Join(errs...)
}

// statsTimeout bounds the reads at the end of a run (the backlog, the
// anomalies), and statsReserve is the time they leave before ctx's
// deadline for the run to write its metrics and return.
const (
	statsTimeout = 10 * time.Second
	statsReserve = time.Second
)

// statsCtx is the context of the reads at the end of a run. It outlives a
// cancelled ctx (the metrics are still wanted), but it ends before ctx's
// deadline (by statsReserve, or half the margin if that is less), so that
// reads waiting on a lock cannot keep the run past its deadline.
func (w *Worker) statsCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), statsTimeout)
	if d, ok := ctx.Deadline(); ok {
		sctx, cancel2 := context.WithDeadline(sctx, d.Add(-min(statsReserve, w.cfg.DeadlineMargin/2)))
		return sctx, func() { cancel2(); cancel() }
	}
	return sctx, cancel
}

// runAcc collects what the drainers of one Run did.
type runAcc struct {
	mu     sync.Mutex
	total  Summary
	errs   []error
	failed int  // errors beyond those kept
	used   bool // a poll or a claim succeeded: the database could be used
}

// succeeded records a poll or claim that succeeded.
func (a *runAcc) succeeded() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.used = true
}

// maxRunErrors bounds the errors a run keeps: a resident worker that cannot
// reach the database fails every poll until its deadline.
const maxRunErrors = 10

func (a *runAcc) add(s Summary, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.total.Processed += s.Processed
	a.total.Ignored += s.Ignored
	a.total.IgnoredOtherMode += s.IgnoredOtherMode
	a.total.Failed += s.Failed
	a.total.AlreadyDone += s.AlreadyDone
	a.total.Anomalies += s.Anomalies
	a.total.Released += s.Released
	a.total.UnexpectedAPIVersion += s.UnexpectedAPIVersion
	if err != nil {
		a.total.PollErrors++
		if len(a.errs) < maxRunErrors {
			a.errs = append(a.errs, err)
		} else {
			a.failed++
		}
	}
}

// round runs drainers until none finds anything to claim (or stopAt is
// reached) and adds what they did to acc. With all, every drainer starts at
// once (the scheduled-only worker). Otherwise one starts, and the others
// join only when a claim comes back full, that is when there is more than
// one claim's worth of backlog: a resident worker that wakes for a receipt
// or two uses one connection, not WORKER_CONCURRENCY.
func (w *Worker) round(ctx context.Context, stopAt time.Time, all bool, acc *runAcc) {
	var (
		wg    sync.WaitGroup
		once  sync.Once
		start func(id int)
		own   = newOwners(w.cfg.ClaimLimit) // the round's drainers apply an invoice one at a time
	)
	grow := func() {
		once.Do(func() {
			for i := 1; i < w.cfg.Concurrency; i++ {
				start(i)
			}
		})
	}
	start = func(id int) {
		wg.Add(1) // while drainer 0 runs, so never from a zero count
		go func() {
			defer wg.Done()
			s, err := w.drain(ctx, id, stopAt, grow, acc.succeeded, own)
			acc.add(s, err)
		}()
	}
	start(0)
	if all {
		grow()
	}
	wg.Wait()
}

// emit writes the run's counts, the backlog gauges when backlog is true
// (they were read) and AnomalyCount when anomalies is true.
func (w *Worker) emit(ctx context.Context, s Summary, backlog, anomalies bool) {
	var ms []metrics.Metric
	if backlog {
		ms = append(ms,
			metrics.Metric{Name: "BacklogCount", Value: float64(s.Remaining), Unit: metrics.Count},
			metrics.Metric{Name: "OldestUnprocessedAgeSeconds", Value: s.OldestAgeSeconds, Unit: metrics.Seconds},
			metrics.Metric{Name: "NeedsReviewCount", Value: float64(s.NeedsReview), Unit: metrics.Count})
	}
	if anomalies {
		ms = append(ms, metrics.Metric{Name: "AnomalyCount", Value: float64(s.UnresolvedAnomalies), Unit: metrics.Count})
	}
	err := w.metrics.Emit(nil, append(ms,
		metrics.Metric{Name: "Processed", Value: float64(s.Processed), Unit: metrics.Count},
		metrics.Metric{Name: "Failed", Value: float64(s.Failed), Unit: metrics.Count},
		metrics.Metric{Name: "Ignored", Value: float64(s.Ignored), Unit: metrics.Count},
		metrics.Metric{Name: "IgnoredOtherMode", Value: float64(s.IgnoredOtherMode), Unit: metrics.Count},
		metrics.Metric{Name: "PollErrors", Value: float64(s.PollErrors), Unit: metrics.Count},
		metrics.Metric{Name: "Deadlocks", Value: float64(s.Deadlocks), Unit: metrics.Count},
	)...)
	if err == nil && (w.cfg.APIVersion != "" || s.UnexpectedAPIVersion > 0) {
		err = w.metrics.Emit(nil, metrics.Metric{Name: "UnexpectedApiVersion", Value: float64(s.UnexpectedAPIVersion), Unit: metrics.Count})
	}
	if err != nil {
		w.logger.ErrorContext(ctx, "writing metrics", "error", err)
	}
}

// drain is one drainer: it holds one connection and claims until nothing is
// left or the deadline margin is reached. It calls full after a claim that
// took all it asked for, and usable after every claim that succeeded.
// Of what it claims, it applies the receipts of invoices no other drainer
// of the round is applying, and hands the others to the drainer that is
// (own; see owners). What was handed to it while it applied a list it
// applies with its next claim (which asks for that many fewer), in the
// same batches, not in a small transaction of their own.
func (w *Worker) drain(ctx context.Context, id int, stopAt time.Time, full, usable func(), own *owners) (Summary, error) {
	var s Summary
	dc := &drainConn{pool: w.pool}
	defer dc.release()
	conns := dc.get

	// While carry is not empty this drainer owns invoices: every way out
	// gives them up, and gives back what it carries.
	var carry []inbox.Claimed
	stop := func() { w.release(ctx, conns, append(carry, own.leave(id)...), &s) }
	for {
		if expired(stopAt) || ctx.Err() != nil {
			stop()
			return s, nil
		}
		var claimed []inbox.Claimed
		if limit := w.cfg.ClaimLimit - len(carry); limit > 0 {
			var err error
			claimed, err = w.claim(ctx, conns, stopAt, limit)
			if err != nil {
				stop()
				if ctx.Err() != nil {
					return s, nil // the run was ended (cancelled) while claiming: not a failure
				}
				return s, fmt.Errorf("drainer %d: %w", id, err)
			}
			usable()
			if len(claimed) == limit {
				full()
			}
			s.UnexpectedAPIVersion += w.countDrift(ctx, claimed)
		}
		if len(claimed) == 0 && len(carry) == 0 {
			return s, nil // owns nothing: the last done gave its invoices up
		}
		if !w.applyClaimed(ctx, conns, stopAt, append(carry, own.take(id, claimed)...), &s) {
			carry = nil // given back by applyClaimed
			stop()
			return s, nil
		}
		carry = own.done(id)
	}
}

// applyClaimed applies claimed receipts in batches of BatchSize (one
// transaction each when BatchSize is 1). It reports false when it stopped
// at the deadline margin (or the end of ctx), having given back the
// receipts it had not started.
func (w *Worker) applyClaimed(ctx context.Context, conns connSource, stopAt time.Time, claimed []inbox.Claimed, s *Summary) bool {
	for i := 0; i < len(claimed); {
		if expired(stopAt) || ctx.Err() != nil {
			w.release(ctx, conns, claimed[i:], s)
			return false
		}
		if w.cfg.BatchSize <= 1 {
			o, anomaly := w.process(ctx, conns, claimed[i])
			s.add(o, anomaly)
			i++
			continue
		}
		batch := claimed[i:min(i+w.cfg.BatchSize, len(claimed))]
		outcomes, anomalies := w.processBatch(ctx, conns, batch)
		for j := range outcomes {
			s.add(outcomes[j], anomalies[j])
		}
		i += len(batch)
	}
	return true
}

// release gives back claimed receipts not started (inbox.Release: attempt
// uncounted, claimable at once), on a context that outlives the run's.
func (w *Worker) release(ctx context.Context, conns connSource, rest []inbox.Claimed, s *Summary) {
	if len(rest) == 0 {
		return
	}
	conn, err := conns(context.WithoutCancel(ctx))
	var released int
	if err == nil {
		released, err = inbox.Release(context.WithoutCancel(ctx), conn, rest, w.Now())
	}
	if err != nil {
		w.logger.ErrorContext(ctx, "releasing claims", "error", err, "count", len(rest))
		return
	}
	s.Released += released
}

// claim is a drainer's claim, on its connection. The server ends it after
// StatementTimeout (a claim waiting on a lock on webhook_inbox fails,
// claims nothing and keeps the connection); the wait for a connection and
// the claim end by stopAt + StatementTimeout at the latest. It takes up to
// n receipts.
func (w *Worker) claim(ctx context.Context, conns connSource, stopAt time.Time, n int) ([]inbox.Claimed, error) {
	var limit time.Time
	if !stopAt.IsZero() {
		limit = stopAt.Add(w.cfg.StatementTimeout)
	}
	cctx, cancel := w.boundedCtx(ctx, limit)
	defer cancel()
	conn, err := conns(cctx)
	if err != nil {
		return nil, err
	}
	return inbox.Claim(cctx, conn, inbox.ClaimParams{
		Now: w.Now(), MaxAttempts: w.cfg.MaxAttempts, Limit: n, Lease: w.cfg.Lease,
		StatementTimeout: w.cfg.StatementTimeout,
	})
}

// boundedCtx is ctx for one poll or claim: it ends at limit (if not zero)
// or after twice StatementTimeout, whichever is first. The server's
// statement timeout normally ends a statement that waits first (and keeps
// the connection); this deadline is for a server or network that does not
// answer at all, and for the end of the run: pgx closes the connection when
// it ends a statement on a context.
func (w *Worker) boundedCtx(ctx context.Context, limit time.Time) (context.Context, context.CancelFunc) {
	d := time.Now().Add(2 * w.cfg.StatementTimeout)
	if !limit.IsZero() && limit.Before(d) {
		d = limit
	}
	return context.WithDeadline(ctx, d)
}
