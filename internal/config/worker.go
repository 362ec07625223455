package config

import (
	"strings"
	"time"

	"github.com/stripe-inbox/inbox/internal/worker"
)

// Worker is the worker function's configuration.
type Worker struct {
	Common
	Worker worker.Config
}

// LoadWorker reads STRIPE_MODE (required: live or test), WORKER_CONCURRENCY,
// MAX_ATTEMPTS, LEASE, STATEMENT_TIMEOUT, DEADLINE_MARGIN, CLAIM_LIMIT,
// BATCH_SIZE, BACKOFF_BASE, BACKOFF_CAP, POLL_INTERVAL (default 250ms; 0
// returns as soon as the inbox is empty), LISTEN (on or off, default off:
// wake on the webhook's notification; see worker.Config.Listen) and
// STRIPE_API_VERSION (optional: count receipts of other versions), and the
// database settings. The pool gets one connection per drainer plus one.
func LoadWorker(env Env) (Worker, error) {
	var p problems
	wc := worker.Config{Mode: strings.TrimSpace(env("STRIPE_MODE"))}
	switch wc.Mode {
	case worker.ModeLive, worker.ModeTest:
	case "":
		p.addf("STRIPE_MODE is required: set it to %q on the stage that books real money (prod) or %q on every other stage; events of the other mode are stored and marked ignored_other_mode, never booked", worker.ModeLive, worker.ModeTest)
	default:
		p.addf("STRIPE_MODE=%q: must be %q (the stage that books real money, prod) or %q (every other stage)", wc.Mode, worker.ModeLive, worker.ModeTest)
	}
	wc.Concurrency = p.integer(env, "WORKER_CONCURRENCY", worker.DefaultConcurrency, 1, 64)
	wc.MaxAttempts = p.integer(env, "MAX_ATTEMPTS", worker.DefaultMaxAttempts, 1, 1000)
	wc.ClaimLimit = p.integer(env, "CLAIM_LIMIT", worker.DefaultClaimLimit, 1, 1000)
	wc.BatchSize = p.integer(env, "BATCH_SIZE", min(worker.DefaultBatchSize, wc.ClaimLimit), 1, 1000)
	wc.Lease = p.duration(env, "LEASE", worker.DefaultLease, time.Second, time.Hour)
	wc.StatementTimeout = p.duration(env, "STATEMENT_TIMEOUT", worker.DefaultStatementTimeout, 10*time.Millisecond, 15*time.Minute)
	wc.DeadlineMargin = p.duration(env, "DEADLINE_MARGIN", worker.DefaultDeadlineMargin, time.Second, 15*time.Minute)
	wc.BackoffBase = p.duration(env, "BACKOFF_BASE", worker.DefaultBackoffBase, 10*time.Millisecond, time.Hour)
	wc.BackoffCap = p.duration(env, "BACKOFF_CAP", worker.DefaultBackoffCap, 10*time.Millisecond, 24*time.Hour)
	wc.PollInterval = p.pollInterval(env)
	wc.Listen = p.onOff(env, "LISTEN", false)
	wc.APIVersion = strings.TrimSpace(env("STRIPE_API_VERSION")) // optional; checked by Validate
	w := Worker{Common: p.common(env, "worker", wc.Concurrency+1), Worker: wc}
	w.Database.PreparedStatements = true // see internal/database
	if int(w.Database.MaxConns) < wc.Concurrency+1 {
		p.addf("DB_MAX_CONNS=%d: the worker needs one connection per drainer plus one (WORKER_CONCURRENCY+1 = %d)", w.Database.MaxConns, wc.Concurrency+1)
	}
	v := wc
	if v.Mode != worker.ModeLive && v.Mode != worker.ModeTest {
		v.Mode = worker.ModeTest // reported above; check the rest
	}
	if err := v.Validate(); err != nil {
		p.addf("%v", err)
	}
	return w, p.err()
}

// pollInterval reads POLL_INTERVAL: 0 (or 0s) is a setting of its own (the
// scheduled-only worker), so it is not read as "unset".
func (p *problems) pollInterval(env Env) time.Duration {
	raw := strings.TrimSpace(env("POLL_INTERVAL"))
	if raw == "" {
		return worker.DefaultPollInterval
	}
	v, err := time.ParseDuration(raw)
	if raw == "0" {
		v, err = 0, nil
	}
	if err != nil || v < 0 {
		p.addf("POLL_INTERVAL=%q: must be 0 (return as soon as the inbox is empty) or a duration from %s to %s such as 250ms (default %s)", raw, worker.MinPollInterval, worker.MaxPollInterval, worker.DefaultPollInterval)
		return worker.DefaultPollInterval
	}
	return v // the range is checked by worker.Config.Validate
}
