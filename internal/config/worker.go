package config

import (
	"strings"
	"time"

	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/worker"
)

// Worker is the worker function's configuration.
type Worker struct {
	Common
	Worker worker.Config
	// Handlers are the handlers' options (STRIPE_UNNAMED_RELEASES).
	Handlers handlers.Options
	// GC is the collector's setting (GOGC, GOMEMLIMIT and
	// AWS_LAMBDA_FUNCTION_MEMORY_SIZE; see gc.go).
	GC GC
}

// LoadWorker reads STRIPE_MODE (required: live or test), WORKER_CONCURRENCY,
// MAX_ATTEMPTS, LEASE, STATEMENT_TIMEOUT, DEADLINE_MARGIN, CLAIM_LIMIT,
// BATCH_SIZE, BACKOFF_BASE, BACKOFF_CAP, POLL_INTERVAL (default 250ms; 0
// returns as soon as the inbox is empty), LISTEN (on or off, default off:
// wake on the webhook's notification; see worker.Config.Listen) and
// STRIPE_API_VERSION (optional: count receipts of other versions),
// STRIPE_UNNAMED_RELEASES (book, the default, or hold: what the handlers do
// with an event of a Stripe release the code has not named; see
// handlers.Options), WRITEBACKS (off, the default, or customer_metadata:
// record the sample write-back's intent with each newly booked payment; see
// docs/writebacks.md), the garbage collector's settings (GC: GOGC,
// GOMEMLIMIT, AWS_LAMBDA_FUNCTION_MEMORY_SIZE; see gc.go), and the database
// settings. The pool gets one connection per drainer plus one.
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
	// Parsed here; the ranges are worker.Config.Validate's (called below).
	wc.Concurrency = p.wholeNumber(env, "WORKER_CONCURRENCY", worker.DefaultConcurrency)
	wc.MaxAttempts = p.wholeNumber(env, "MAX_ATTEMPTS", worker.DefaultMaxAttempts)
	wc.ClaimLimit = p.wholeNumber(env, "CLAIM_LIMIT", worker.DefaultClaimLimit)
	wc.BatchSize = p.wholeNumber(env, "BATCH_SIZE", min(worker.DefaultBatchSize, wc.ClaimLimit))
	wc.Lease = p.duration(env, "LEASE", worker.DefaultLease)
	wc.StatementTimeout = p.duration(env, "STATEMENT_TIMEOUT", worker.DefaultStatementTimeout)
	wc.DeadlineMargin = p.duration(env, "DEADLINE_MARGIN", worker.DefaultDeadlineMargin)
	wc.BackoffBase = p.duration(env, "BACKOFF_BASE", worker.DefaultBackoffBase)
	wc.BackoffCap = p.duration(env, "BACKOFF_CAP", worker.DefaultBackoffCap)
	wc.PollInterval = p.pollInterval(env)
	wc.Listen = p.onOff(env, "LISTEN", false)
	wc.APIVersion = strings.TrimSpace(env("STRIPE_API_VERSION")) // optional; checked by Validate
	w := Worker{Common: p.common(env, "worker", max(wc.Concurrency, 1)+1), Worker: wc}
	w.Handlers.UnnamedReleases = handlers.UnnamedReleases(strings.TrimSpace(env("STRIPE_UNNAMED_RELEASES")))
	if w.Handlers.UnnamedReleases == "" {
		w.Handlers.UnnamedReleases = handlers.BookUnnamed
	}
	w.Handlers.Writebacks = handlers.ParseWritebacks(env("WRITEBACKS"))
	w.GC = p.gc(env)
	p.addErr("", w.Handlers.Validate())
	w.Database.PreparedStatements = true // see internal/database
	if wc.Concurrency >= 1 && int(w.Database.MaxConns) < wc.Concurrency+1 {
		p.addf("DB_MAX_CONNS=%d: the worker needs one connection per drainer plus one (WORKER_CONCURRENCY+1 = %d)", w.Database.MaxConns, wc.Concurrency+1)
	}
	v := wc
	if v.Mode != worker.ModeLive && v.Mode != worker.ModeTest {
		v.Mode = worker.ModeTest // reported above; check the rest
	}
	p.addErr("", v.Validate())
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
