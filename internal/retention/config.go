package retention

import (
	"errors"
	"fmt"
	"time"
)

// Day is the unit retention is configured in. It is exactly 24 hours: the
// cutoff is "now minus n times 24h", never shifted by a daylight-saving change.
const Day = 24 * time.Hour

// MinRetention is the shortest retention Validate accepts. Stripe retries a
// webhook delivery for up to 3 days; a receipt deleted before the last retry
// could arrive would let that retry be stored and processed again. One day
// more covers retries scheduled near the end of the window and clock skew.
const MinRetention = 4 * Day

// Config tunes the purge. Zero values take the defaults below (ScrubAfter's
// zero means scrubbing is off); Validate rejects settings that would break
// the inbox's guarantees.
type Config struct {
	// Retention is how long a processed receipt (by processed_at) and a
	// published outbox row (by published_at) are kept. Rows strictly older
	// than this are deleted; a row exactly Retention old is kept.
	Retention time.Duration
	// BatchSize is how many rows one batch deletes (or scrubs). Each batch is
	// one statement that commits on its own, so it bounds how many row locks
	// the purge holds at once and for how long.
	BatchSize int
	// ScrubAfter, when non-zero, replaces the payload of processed receipts
	// older than this with a marker: the row and its key stay (a redelivery
	// is still a duplicate) but the personal data in the event goes. It must
	// be shorter than Retention, or every row would be deleted first.
	ScrubAfter time.Duration
	// DeadlineMargin: no new batch starts when the invocation has less than
	// this left, so the run ends with its counts reported instead of being
	// killed mid-batch.
	DeadlineMargin time.Duration
}

// Defaults.
const (
	DefaultRetention      = 30 * Day
	DefaultBatchSize      = 1000
	DefaultDeadlineMargin = 10 * time.Second
	MaxBatchSize          = 100_000
	// MaxRetention bounds Retention (ten years).
	MaxRetention = 3650 * Day
)

// WithDefaults fills zero fields (except ScrubAfter, whose zero is "off").
func (c Config) WithDefaults() Config {
	if c.Retention == 0 {
		c.Retention = DefaultRetention
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.DeadlineMargin == 0 {
		c.DeadlineMargin = DefaultDeadlineMargin
	}
	return c
}

// Validate reports every mistake, phrased as what to fix. The variable names
// are those functions/purge reads. It is the one place where the settings'
// ranges are checked: config.LoadPurge only parses them and reports what
// Validate finds, and New validates before it builds.
func (c Config) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.Retention > MaxRetention {
		add("RETENTION_DAYS=%s: must be at most %s days", days(c.Retention), days(MaxRetention))
	}
	if c.Retention < MinRetention {
		add("RETENTION_DAYS=%s: must be at least %s days: Stripe retries a webhook for up to 3 days, and a receipt deleted earlier lets a late retry be processed again",
			days(c.Retention), days(MinRetention))
	}
	if c.BatchSize < 1 || c.BatchSize > MaxBatchSize {
		add("PURGE_BATCH_SIZE=%d: must be from 1 to %d", c.BatchSize, MaxBatchSize)
	}
	if c.ScrubAfter != 0 {
		if c.ScrubAfter < MinRetention {
			add("SCRUB_PAYLOAD_AFTER_DAYS=%s: must be 0 (off) or at least %s days, so a payload is kept through Stripe's 3-day retry window, while an operator may still need to compare a late retry with what was processed",
				days(c.ScrubAfter), days(MinRetention))
		}
		if c.ScrubAfter >= c.Retention {
			add("SCRUB_PAYLOAD_AFTER_DAYS=%s must be shorter than RETENTION_DAYS=%s (receipts are deleted at RETENTION_DAYS; scrubbing them later would never happen)",
				days(c.ScrubAfter), days(c.Retention))
		}
	}
	if c.DeadlineMargin < time.Second || c.DeadlineMargin > 15*time.Minute {
		add("DEADLINE_MARGIN=%s: must be from 1s to 15m", c.DeadlineMargin)
	}
	return errors.Join(errs...)
}

// days prints d as a number of days when it is whole, otherwise as a duration.
func days(d time.Duration) string {
	if d%Day == 0 {
		return fmt.Sprintf("%d", d/Day)
	}
	return d.String()
}
