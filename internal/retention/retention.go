// Package retention is the scheduled purge (functions/purge): it deletes
// processed receipts, published outbox rows and done write-back intents
// (internal/writeback) once they are older than the retention, and optionally scrubs the payload of processed receipts earlier.
//
// A receipt is what makes a redelivery of a Stripe event a no-op, so it must
// outlive Stripe's retry window (up to 3 days) by a safe margin; Config
// refuses a retention shorter than 4 days. Past the retention a late
// redelivery would be stored and processed again, and the business keys of
// the handlers (one payment per invoice, one booking per refund id) are what
// still keep it from booking anything twice.
//
// The purge never touches an unprocessed receipt (including one waiting for
// review), an unpublished outbox row, or the anomalies table. It works in
// bounded batches, each one statement that commits on its own and skips rows
// another transaction has locked (see queries.go; the receipts' statements
// are internal/inbox's, with the table's other SQL), so it never holds many
// locks or a long transaction that would stall receipts or the worker's
// claims. It stops when a batch comes back short, or when the invocation's
// deadline is within the margin.
package retention

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/metrics"
	"github.com/stripe-inbox/inbox/internal/outbox"
	"github.com/stripe-inbox/inbox/internal/writeback"
)

// DB is what the purge needs: a pool or a dedicated connection. It must not
// be a transaction, since each batch has to commit on its own.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Purger runs the purge.
type Purger struct {
	db      DB
	cfg     Config
	logger  *slog.Logger
	metrics *metrics.Emitter

	// Now returns the time the cutoffs are computed from; nil means the
	// database's now(). Tests set it to move time without sleeping.
	Now func() *time.Time
}

// New returns a Purger, as River's NewClient does: it fills cfg's zero
// fields with the defaults (WithDefaults), then validates it, and returns an
// error saying what to fix instead of a purge that could delete receipts
// inside Stripe's retry window. em may be nil (no metrics).
func New(db DB, cfg Config, logger *slog.Logger, em *metrics.Emitter) (*Purger, error) {
	cfg = cfg.WithDefaults()
	errs := []error{cfg.Validate()}
	if db == nil {
		errs = append(errs, errors.New("no database"))
	}
	if logger == nil {
		errs = append(errs, errors.New("no logger"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("invalid purge configuration: %w", err)
	}
	return &Purger{db: db, cfg: cfg, logger: logger, metrics: em, Now: func() *time.Time { return nil }}, nil
}

// Summary is what one Run did.
type Summary struct {
	PurgedReceipts int64 `json:"purged_receipts"`
	PurgedOutbox   int64 `json:"purged_outbox"`
	// PurgedWritebacks: done write-back intents (internal/writeback).
	PurgedWritebacks int64 `json:"purged_writebacks"`
	ScrubbedPayloads int64 `json:"scrubbed_payloads"`
	// Batches counts the statements that deleted or scrubbed at least one
	// row, each its own transaction. The final statement of each table that
	// finds nothing left is not counted.
	Batches int `json:"batches"`
	// StoppedAtDeadline is set when the run stopped because the invocation's
	// deadline was within the margin; the next run continues. A purge that
	// stops here every day is falling behind (raise the timeout or the batch
	// size).
	StoppedAtDeadline bool `json:"stopped_at_deadline"`
	// Cutoff: rows processed (or published) strictly before it are deleted.
	Cutoff time.Time `json:"cutoff,omitzero"`
	// ScrubCutoff: processed receipts strictly before it are scrubbed; zero
	// when scrubbing is off.
	ScrubCutoff time.Time `json:"scrub_cutoff,omitzero"`
	DurationMs  int64     `json:"duration_ms"`
}

// step is one table's batch loop.
type step struct {
	what   string // for logs and errors
	batch  func(ctx context.Context, db inbox.Execer, cutoff time.Time, limit int) (int64, error)
	cutoff time.Time
	count  *int64
}

// purgeOutbox deletes one batch of published outbox rows
// (outbox.PurgePublished).
func purgeOutbox(ctx context.Context, db inbox.Execer, cutoff time.Time, limit int) (int64, error) {
	return outbox.PurgePublished(ctx, db, cutoff, limit)
}

// purgeWritebacks deletes one batch of done write-back intents
// (writeback.PurgeDone).
func purgeWritebacks(ctx context.Context, db inbox.Execer, cutoff time.Time, limit int) (int64, error) {
	return writeback.PurgeDone(ctx, db, cutoff, limit)
}

// Run purges (and scrubs, when configured) until a batch of each comes back
// short or ctx's deadline is within the margin, then logs the summary and
// emits the metrics. Rows deleted before an error stay deleted and are
// counted in the summary returned with the error.
func (p *Purger) Run(ctx context.Context) (Summary, error) {
	start := time.Now()
	var stopAt time.Time
	if d, ok := ctx.Deadline(); ok {
		stopAt = d.Add(-p.cfg.DeadlineMargin)
	}
	var s Summary
	err := p.run(ctx, stopAt, &s)
	s.DurationMs = time.Since(start).Milliseconds()

	attrs := []any{
		"purged_receipts", s.PurgedReceipts, "purged_outbox", s.PurgedOutbox, "purged_writebacks", s.PurgedWritebacks, "scrubbed_payloads", s.ScrubbedPayloads,
		"batches", s.Batches, "stopped_at_deadline", s.StoppedAtDeadline, "cutoff", s.Cutoff, "duration_ms", s.DurationMs,
	}
	if err != nil {
		p.logger.ErrorContext(ctx, "purge failed", append(attrs, "error", err.Error())...)
	} else {
		p.logger.InfoContext(ctx, "purge", attrs...)
	}
	// Emitted after a failure too: the counted rows are gone either way.
	p.emit(ctx, s)
	return s, err
}

func (p *Purger) run(ctx context.Context, stopAt time.Time, s *Summary) error {
	var cutoff, scrubCutoff time.Time
	if err := p.db.QueryRow(ctx, purgeCutoffs, p.Now(), p.cfg.Retention.Milliseconds(), p.cfg.ScrubAfter.Milliseconds()).
		Scan(&cutoff, &scrubCutoff); err != nil {
		return fmt.Errorf("computing the purge cutoff: %w", err)
	}
	s.Cutoff = cutoff
	steps := []step{
		{what: "processed receipts", batch: inbox.PurgeProcessed, cutoff: cutoff, count: &s.PurgedReceipts},
		{what: "published outbox rows", batch: purgeOutbox, cutoff: cutoff, count: &s.PurgedOutbox},
		{what: "done write-back intents", batch: purgeWritebacks, cutoff: cutoff, count: &s.PurgedWritebacks},
	}
	if p.cfg.ScrubAfter > 0 {
		s.ScrubCutoff = scrubCutoff
		steps = append(steps, step{what: "receipt payloads", batch: inbox.ScrubPayloads, cutoff: scrubCutoff, count: &s.ScrubbedPayloads})
	}

	expired := func() bool { return !stopAt.IsZero() && !time.Now().Before(stopAt) }
	for _, st := range steps {
		for {
			if expired() {
				s.StoppedAtDeadline = true
				return nil
			}
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("purging %s: %w", st.what, err)
			}
			n, err := st.batch(ctx, p.db, st.cutoff, p.cfg.BatchSize)
			if err != nil {
				return fmt.Errorf("purging %s: %w", st.what, err)
			}
			if n > 0 {
				s.Batches++
				*st.count += n
				p.logger.DebugContext(ctx, "purge batch", "rows", n, "what", st.what)
			}
			if n < int64(p.cfg.BatchSize) {
				break
			}
		}
	}
	return nil
}

func (p *Purger) emit(ctx context.Context, s Summary) {
	ms := []metrics.Metric{
		{Name: "PurgedReceipts", Value: float64(s.PurgedReceipts), Unit: metrics.Count},
		{Name: "PurgedOutbox", Value: float64(s.PurgedOutbox), Unit: metrics.Count},
		{Name: "PurgeDurationMs", Value: float64(s.DurationMs), Unit: metrics.Milliseconds},
	}
	if p.cfg.ScrubAfter > 0 {
		ms = append(ms, metrics.Metric{Name: "ScrubbedPayloads", Value: float64(s.ScrubbedPayloads), Unit: metrics.Count})
	}
	if err := p.metrics.Emit(nil, ms...); err != nil {
		p.logger.ErrorContext(ctx, "writing metrics", "error", err)
	}
}
