package config

import (
	"github.com/stripe-inbox/inbox/internal/retention"
)

// Purge is the purge function's configuration.
type Purge struct {
	Common
	Purge retention.Config
}

// LoadPurge reads RETENTION_DAYS (default 30, at least 4: Stripe retries for
// up to 3 days), PURGE_BATCH_SIZE (default 1000), SCRUB_PAYLOAD_AFTER_DAYS
// (default 0 = off; otherwise at least 4 and less than RETENTION_DAYS) and
// DEADLINE_MARGIN (default 10s), and the database settings. The purge runs
// its batches one after another on one connection; the pool's second
// connection is spare.
func LoadPurge(env Env) (Purge, error) {
	var p problems
	rc := retention.Config{}
	// Parsed here; the ranges are retention.Config.Validate's (called
	// below), which refuses a retention under 4 days and says why.
	rc.Retention = p.days(env, "RETENTION_DAYS", int(retention.DefaultRetention/retention.Day), retention.Day)
	rc.BatchSize = p.wholeNumber(env, "PURGE_BATCH_SIZE", retention.DefaultBatchSize)
	rc.ScrubAfter = p.days(env, "SCRUB_PAYLOAD_AFTER_DAYS", 0, retention.Day)
	rc.DeadlineMargin = p.duration(env, "DEADLINE_MARGIN", retention.DefaultDeadlineMargin)
	c := Purge{Common: p.common(env, "purge", 2), Purge: rc}
	p.addErr("", rc.Validate())
	return c, p.err()
}
