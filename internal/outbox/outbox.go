// Package outbox is the outbox table: it relays the rows to Amazon
// EventBridge, and holds all of the table's SQL (queries.go): the INSERT the
// handlers compose into their statements (InsertRowsSQL), the relay's, the
// operators' (ops.go) and the purge's batch (purge.go).
//
// The handlers write an outbox row in the same transaction as the business
// effect; the relay publishes each one at least once with PutEvents and then
// marks it published. It is safe with several relays (several overlapping
// worker invocations): a claim (one autocommit statement) takes due rows
// with FOR UPDATE SKIP LOCKED, counts the attempt, hides them for a lease and
// stamps them with a fresh fencing token; the mark after PutEvents applies
// only to rows that still carry that token. A relay that stalled past its
// lease (its rows were claimed again by another relay, which now owns them)
// cannot mark, or release, or fail them: its late mark changes nothing, and
// the owner's outcome stands. A relay that dies between PutEvents and the
// mark leaves rows that were published but not marked; they are due again
// when the lease ends and are published again: delivery is at least once,
// and every entry's detail carries outbox_id, the row's id, for consumers to
// de-duplicate.
//
// PutEvents takes at most 10 entries and 256 KB per call (see entry.go), and
// answers per entry: an entry that failed (FailedEntryCount, ErrorCode) is
// retried alone, after a backoff, and counts an attempt; at MaxAttempts it
// waits for a human (available_at 'infinity'; List and RetryRows). A
// throttled entry or call, or a call that fails as a whole (5xx, network,
// missing bus or permission: nothing about the rows), gives its rows back
// with the attempt uncounted and pauses the relay with a growing backoff, so
// an outage of EventBridge never parks rows.
package outbox

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"math"
	mrand "math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	"github.com/aws/smithy-go"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stripe-inbox/inbox/internal/metrics"
)

// Publisher is the one EventBridge call the relay makes;
// *eventbridge.Client implements it.
type Publisher interface {
	PutEvents(ctx context.Context, in *eventbridge.PutEventsInput, optFns ...func(*eventbridge.Options)) (*eventbridge.PutEventsOutput, error)
}

// DB is what the operator functions need: a pool, a connection or a
// transaction.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Relay publishes the outbox. One Run goes on at a time per Relay.
type Relay struct {
	pool    *pgxpool.Pool
	client  Publisher
	cfg     Config
	logger  *slog.Logger
	metrics *metrics.Emitter

	// Now returns the time to use for claims, leases and backoff; nil means
	// the database's now() (and time.Now for the pause). Tests set it to
	// move time without sleeping.
	Now func() *time.Time
	// Jitter returns a number in [0, 1); math/rand by default.
	Jitter func() float64

	mu          sync.Mutex // one Run at a time
	pausedUntil time.Time
	failedCalls int     // throttled or failed calls in a row
	totals      Summary // since the last Report
}

// New returns a Relay after applying defaults to cfg and validating it.
func New(pool *pgxpool.Pool, client Publisher, cfg Config, logger *slog.Logger, em *metrics.Emitter) (*Relay, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("outbox relay: %w", err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Relay{pool: pool, client: client, cfg: cfg, logger: logger, metrics: em,
		Now: func() *time.Time { return nil }, Jitter: mrand.Float64}, nil
}

// Config is the relay's configuration, defaults applied.
func (r *Relay) Config() Config { return r.cfg }

// Summary is what Run did.
type Summary struct {
	Published int  `json:"published"`  // rows published and marked
	Failed    int  `json:"failed"`     // entries EventBridge refused (retried after a backoff)
	Throttled int  `json:"throttled"`  // entries given back because of throttling
	Released  int  `json:"released"`   // rows given back uncounted (a failed call, or no time left)
	Fenced    int  `json:"fenced"`     // published rows this relay could not mark: another relay owns them now
	Calls     int  `json:"calls"`      // PutEvents calls
	CallFails int  `json:"call_fails"` // calls that failed as a whole
	Paused    bool `json:"paused"`     // the run found the relay pausing after throttling or a failed call
}

func (s *Summary) add(o Summary) {
	s.Published += o.Published
	s.Failed += o.Failed
	s.Throttled += o.Throttled
	s.Released += o.Released
	s.Fenced += o.Fenced
	s.Calls += o.Calls
	s.CallFails += o.CallFails
}

// dbTimeout bounds each of the relay's statements. They run on a context
// that outlives ctx's cancellation: a mark after a PutEvents that
// succeeded is wanted even when the run was cut short.
const dbTimeout = 10 * time.Second

// Run publishes due rows, claim after claim, until a claim comes back short,
// ctx ends, or EventBridge throttles or fails a call (the relay then pauses;
// a Run during the pause returns at once with Paused). It returns an error
// only when the database could not be used.
func (r *Relay) Run(ctx context.Context) (Summary, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var s Summary
	if r.clock().Before(r.pausedUntil) {
		s.Paused = true
		return s, nil
	}
	for ctx.Err() == nil {
		rows, token, err := r.claim(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return s, nil
			}
			return s, err
		}
		if len(rows) == 0 {
			return s, nil
		}
		stop, err := r.publish(ctx, rows, token, &s)
		if err != nil || stop || len(rows) < r.cfg.ClaimLimit {
			return s, err
		}
	}
	return s, nil
}

// PublishDue is the relay's entry point for the worker (worker.Relay): Run,
// and with final (the end of an invocation) also park exhausted rows, read
// the backlog and write the metrics of everything since the last final
// call. It returns the rows published.
func (r *Relay) PublishDue(ctx context.Context, final bool) (int, error) {
	s, err := r.Run(ctx)
	r.mu.Lock()
	r.totals.add(s)
	r.mu.Unlock()
	if s.Published+s.Failed+s.Throttled+s.Fenced+s.CallFails > 0 {
		r.logger.InfoContext(ctx, "outbox relay", "summary", s)
	}
	if final {
		if rerr := r.report(ctx); rerr != nil && err == nil {
			err = rerr
		}
	}
	return s.Published, err
}

// report parks exhausted rows, reads the backlog and writes the metrics.
func (r *Relay) report(ctx context.Context) error {
	r.mu.Lock()
	t := r.totals
	r.totals = Summary{}
	r.mu.Unlock()
	dctx, cancel := r.dbCtx(ctx)
	defer cancel()
	if n, err := ParkExhausted(dctx, r.pool, r.cfg.MaxAttempts, r.Now()); err != nil {
		r.logger.ErrorContext(ctx, "outbox: parking rows", "error", err)
	} else if n > 0 {
		r.logger.ErrorContext(ctx, "outbox: rows used up their attempts and wait for review", "count", n)
	}
	ms := []metrics.Metric{
		{Name: "OutboxPublished", Value: float64(t.Published), Unit: metrics.Count},
		{Name: "OutboxFailed", Value: float64(t.Failed), Unit: metrics.Count},
		{Name: "OutboxThrottled", Value: float64(t.Throttled), Unit: metrics.Count},
		{Name: "OutboxCallFailed", Value: float64(t.CallFails), Unit: metrics.Count},
		{Name: "OutboxFenced", Value: float64(t.Fenced), Unit: metrics.Count},
	}
	b, err := ReadBacklog(dctx, r.pool, r.cfg.MaxAttempts, r.Now())
	if err == nil {
		// Gauges only when read: a missing gauge alarms (missing data is
		// breaching), a made-up zero would not.
		ms = append(ms,
			metrics.Metric{Name: "OutboxBacklogCount", Value: float64(b.Count), Unit: metrics.Count},
			metrics.Metric{Name: "OutboxOldestAgeSeconds", Value: b.OldestAgeSeconds, Unit: metrics.Seconds},
			metrics.Metric{Name: "OutboxNeedsReviewCount", Value: float64(b.NeedsReview), Unit: metrics.Count})
	}
	if merr := r.metrics.Emit(nil, ms...); merr != nil {
		r.logger.ErrorContext(ctx, "writing metrics", "error", merr)
	}
	return err
}

func (r *Relay) clock() time.Time {
	if t := r.Now(); t != nil {
		return *t
	}
	return time.Now()
}

// claim takes due rows under a fresh fencing token. It runs on dbCtx, not
// on the run's ctx: a claim the server committed is always read, even when
// ctx ends while its answer is on the way, so that publish can give the
// rows back (it does when ctx has ended). Cancelled halfway, pgx would drop
// the answer and the rows would stay leased, to nobody, for the lease
// (OUTBOX_LEASE, 2 min): a relay run that ended just then (a resident run's
// stopAt) would delay them that long. Run checks ctx before each claim.
func (r *Relay) claim(ctx context.Context) ([]row, string, error) {
	token, err := newToken()
	if err != nil {
		return nil, "", err
	}
	cctx, cancel := r.dbCtx(ctx)
	defer cancel()
	rs, err := r.pool.Query(cctx, claimRows, r.Now(), r.cfg.MaxAttempts, r.cfg.ClaimLimit, r.cfg.Lease.Seconds(), token)
	if err != nil {
		return nil, "", fmt.Errorf("claiming outbox rows: %w", err)
	}
	rows, err := pgx.CollectRows(rs, func(rw pgx.CollectableRow) (row, error) {
		var x row
		err := rw.Scan(&x.id, &x.aggregateType, &x.aggregateID, &x.eventType, &x.payload, &x.createdAt, &x.attempts)
		return x, err
	})
	if err != nil {
		return nil, "", fmt.Errorf("claiming outbox rows: %w", err)
	}
	return rows, token, nil
}

// publish sends claimed rows in calls and records each row's outcome. It
// reports whether the run must stop (throttled, a failed call, no time
// left); rows it did not send are then given back.
func (r *Relay) publish(ctx context.Context, rows []row, token string, s *Summary) (bool, error) {
	entries := make([]types.PutEventsRequestEntry, 0, len(rows))
	sizes := make([]int, 0, len(rows))
	var sendable []row
	var bad []failure
	for _, rw := range rows {
		e, err := entry(rw, r.cfg.Bus, r.cfg.Source)
		if err == nil && EntrySize(e) > MaxCallBytes {
			err = fmt.Errorf("outbox row %d: entry of %d bytes is over the %d bytes of a PutEvents call", rw.id, EntrySize(e), MaxCallBytes)
		}
		if err != nil {
			bad = append(bad, failure{row: rw, reason: "invalid: " + err.Error()})
			continue
		}
		entries, sizes, sendable = append(entries, e), append(sizes, EntrySize(e)), append(sendable, rw)
	}
	if len(bad) > 0 {
		s.Failed += len(bad)
		if err := r.recordFailures(ctx, bad, token); err != nil {
			return true, err
		}
	}
	calls := split(sizes)
	for ci, call := range calls {
		if ctx.Err() != nil {
			return true, r.releaseRest(ctx, sendable, calls[ci:], token, 0, "", s)
		}
		in := &eventbridge.PutEventsInput{Entries: make([]types.PutEventsRequestEntry, len(call))}
		for j, i := range call {
			in.Entries[j] = entries[i]
		}
		s.Calls++
		cctx, cancel := context.WithTimeout(ctx, r.cfg.CallTimeout)
		out, err := r.client.PutEvents(cctx, in)
		cancel()
		if err != nil && ctx.Err() != nil {
			// The run ended (its deadline) during the call: the entries may
			// or may not have been accepted. Give the rows back uncounted,
			// due at once: published again, at least once. No pause:
			// EventBridge did nothing wrong.
			return true, r.releaseRest(ctx, sendable, calls[ci:], token, 0, "", s)
		}
		if err != nil {
			// Nothing about the rows: give them back uncounted and pause.
			s.CallFails++
			reason := "call failed: " + describe(err)
			pause := r.pause()
			r.logger.WarnContext(ctx, "outbox: PutEvents failed; pausing", "error", err, "throttled", isThrottling(err), "pause_ms", pause.Milliseconds(), "entries", len(call))
			if isThrottling(err) {
				s.Throttled += len(call)
				reason = "throttled: " + describe(err)
			}
			return true, r.releaseRest(ctx, sendable, calls[ci:], token, pause, reason, s)
		}
		var (
			ok        []int64
			failed    []failure
			throttled []int64
		)
		for j, i := range call {
			rw := sendable[i]
			switch {
			case j >= len(out.Entries):
				failed = append(failed, failure{row: rw, reason: "no result for the entry"})
			case out.Entries[j].ErrorCode == nil || *out.Entries[j].ErrorCode == "":
				ok = append(ok, rw.id)
			case *out.Entries[j].ErrorCode == "ThrottlingException":
				throttled = append(throttled, rw.id)
			default:
				failed = append(failed, failure{row: rw, reason: aws.ToString(out.Entries[j].ErrorCode) + ": " + aws.ToString(out.Entries[j].ErrorMessage)})
			}
		}
		if len(ok) > 0 {
			marked, err := r.mark(ctx, ok, token)
			if err != nil {
				return true, err
			}
			s.Published += marked
			if marked < len(ok) {
				s.Fenced += len(ok) - marked
				r.logger.WarnContext(ctx, "outbox: published rows were claimed by another relay after this one's lease ended; left to it", "count", len(ok)-marked)
			}
		}
		if len(failed) > 0 {
			s.Failed += len(failed)
			for _, f := range failed {
				r.logger.WarnContext(ctx, "outbox: entry refused", "outbox_id", f.row.id, "event_type", f.row.eventType, "attempt", f.row.attempts,
					"error", f.reason, "needs_review", f.row.attempts >= r.cfg.MaxAttempts)
			}
			if err := r.recordFailures(ctx, failed, token); err != nil {
				return true, err
			}
		}
		if len(throttled) > 0 {
			s.Throttled += len(throttled)
			pause := r.pause()
			r.logger.WarnContext(ctx, "outbox: entries throttled; pausing", "count", len(throttled), "pause_ms", pause.Milliseconds())
			if err := r.release(ctx, throttled, token, pause, "throttled: ThrottlingException", s); err != nil {
				return true, err
			}
			return true, r.releaseRest(ctx, sendable, calls[ci+1:], token, pause, "", s)
		}
		r.failedCalls = 0
	}
	return false, nil
}

// failure is a row whose entry failed, and why.
type failure struct {
	row    row
	reason string
}

// pause starts (or lengthens) the pause after throttling or a failed call
// and returns its length, the delay of the rows given back.
func (r *Relay) pause() time.Duration {
	r.failedCalls++
	d := r.backoff(r.failedCalls)
	r.pausedUntil = r.clock().Add(d)
	return d
}

// backoff is min(cap, base·2^(n−1)), jittered to 50-100 %.
func (r *Relay) backoff(n int) time.Duration {
	exp := math.Pow(2, float64(max(n-1, 0)))
	d := time.Duration(math.Min(float64(r.cfg.BackoffCap), float64(r.cfg.BackoffBase)*exp))
	return time.Duration(float64(d) * (0.5 + r.Jitter()/2))
}

func (r *Relay) dbCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), dbTimeout)
}

// mark marks ids published if they still carry token, and returns how many
// it marked.
func (r *Relay) mark(ctx context.Context, ids []int64, token string) (int, error) {
	dctx, cancel := r.dbCtx(ctx)
	defer cancel()
	tag, err := r.pool.Exec(dctx, markPublished, ids, token, r.Now())
	if err != nil {
		return 0, fmt.Errorf("marking outbox rows published: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

func (r *Relay) recordFailures(ctx context.Context, fs []failure, token string) error {
	ids := make([]int64, len(fs))
	delays := make([]float64, len(fs))
	reasons := make([]string, len(fs))
	for i, f := range fs {
		ids[i], delays[i], reasons[i] = f.row.id, r.backoff(f.row.attempts).Seconds(), truncate(f.reason)
	}
	dctx, cancel := r.dbCtx(ctx)
	defer cancel()
	if _, err := r.pool.Exec(dctx, recordFailures, ids, delays, reasons, token, r.Now(), r.cfg.MaxAttempts); err != nil {
		return fmt.Errorf("recording outbox failures: %w", err)
	}
	return nil
}

// release gives ids back uncounted, due after delay.
func (r *Relay) release(ctx context.Context, ids []int64, token string, delay time.Duration, reason string, s *Summary) error {
	if len(ids) == 0 {
		return nil
	}
	var why *string
	if reason != "" {
		why = aws.String(truncate(reason))
	}
	dctx, cancel := r.dbCtx(ctx)
	defer cancel()
	tag, err := r.pool.Exec(dctx, releaseRows, ids, delay.Seconds(), why, token, r.Now())
	if err != nil {
		return fmt.Errorf("releasing outbox rows: %w", err)
	}
	s.Released += int(tag.RowsAffected())
	return nil
}

// releaseRest gives back the rows of calls (indexes into rows).
func (r *Relay) releaseRest(ctx context.Context, rows []row, calls [][]int, token string, delay time.Duration, reason string, s *Summary) error {
	var ids []int64
	for _, call := range calls {
		for _, i := range call {
			ids = append(ids, rows[i].id)
		}
	}
	return r.release(ctx, ids, token, delay, reason, s)
}

// isThrottling reports whether err is EventBridge throttling the call.
func isThrottling(err error) bool {
	var ae smithy.APIError
	return errors.As(err, &ae) && (ae.ErrorCode() == "ThrottlingException" || ae.ErrorCode() == "TooManyRequestsException")
}

func describe(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode() + ": " + ae.ErrorMessage()
	}
	return err.Error()
}

func truncate(s string) string {
	const max = 500
	if len(s) > max {
		return strings.ToValidUTF8(s[:max], "") + "…" // not a rune cut in two
	}
	return s
}

// newToken is a fresh fencing token: a random (version 4) UUID.
func newToken() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("fencing token: %w", err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16]), nil
}
