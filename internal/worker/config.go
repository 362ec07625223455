package worker

import (
	"errors"
	"fmt"
	"time"

	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/stripeevent"
)

// Config tunes the worker. Zero values take the defaults below; Validate
// rejects combinations that would break its guarantees.
type Config struct {
	// Mode is the Stripe mode this deployment books: ModeLive or ModeTest.
	// A receipt whose livemode is the other one is marked processed with the
	// outcome ignored_other_mode, without running its handler. It has no
	// default: a deployment must say which money it books.
	Mode string
	// Concurrency is the number of drainers, each on its own connection.
	Concurrency int
	// MaxAttempts is how many times a receipt is tried before it waits for a
	// human (needs review).
	MaxAttempts int
	// Lease is how long a claimed receipt stays hidden from other claims.
	Lease time.Duration
	// StatementTimeout bounds each statement of a processing transaction,
	// including the wait for the receipt's row lock.
	StatementTimeout time.Duration
	// DeadlineMargin: drainers stop claiming, and give back claimed receipts
	// they have not started, when the invocation has less than this left.
	DeadlineMargin time.Duration
	// ClaimLimit is how many receipts one claim takes.
	ClaimLimit int
	// BatchSize is how many claimed receipts share one processing
	// transaction, each under its own savepoint. 1 is the seed design: one
	// transaction (and one WAL flush) per receipt.
	BatchSize int
	// BackoffBase and BackoffCap shape the retry delay after a failure:
	// min(cap, base * 2^(attempts-1)), jittered to 50-100%.
	BackoffBase time.Duration
	BackoffCap  time.Duration
	// PollInterval makes the worker resident: once the backlog is drained it
	// keeps looking for receipts every PollInterval (an index probe on the
	// claim's index) until the invocation's deadline minus DeadlineMargin,
	// instead of returning. 0 (the zero value: no default is filled in) is
	// the scheduled-only worker: return when nothing is claimable.
	// config.LoadWorker defaults it to DefaultPollInterval.
	PollInterval time.Duration
	// Listen (with PollInterval > 0) also wakes the resident worker as soon
	// as the webhook notifies (NotifyChannel) a stored receipt, through one
	// LISTEN connection of its own. Polling stays the guarantee: a lost
	// notification costs at most PollInterval.
	Listen bool
	// APIVersion is the Stripe API version the handlers are written for
	// (STRIPE_API_VERSION). Claimed receipts of another version are counted
	// (metric UnexpectedApiVersion, see drift.go); empty: not counted.
	APIVersion string
}

// The Stripe modes a deployment books.
const (
	ModeLive = "live"
	ModeTest = "test"
)

// Defaults.
const (
	DefaultConcurrency      = 4
	DefaultMaxAttempts      = inbox.DefaultMaxAttempts // the bound is inbox.CheckMaxAttempts
	DefaultLease            = 2 * time.Minute
	DefaultStatementTimeout = 2 * time.Second
	DefaultDeadlineMargin   = 30 * time.Second
	DefaultClaimLimit       = 50
	DefaultBatchSize        = 50
	// MaxBatchSize is PGPROC_MAX_CACHED_SUBXIDS: the subtransactions one
	// transaction can have before PostgreSQL marks its snapshot data as
	// overflowed.
	MaxBatchSize       = 64
	DefaultBackoffBase = 2 * time.Second
	DefaultBackoffCap  = 5 * time.Minute
	// DefaultPollInterval is what config.LoadWorker sets when POLL_INTERVAL
	// is not given: a receipt waits about half of it on average for an idle
	// worker that was not woken by a notification.
	DefaultPollInterval = 250 * time.Millisecond
	// MinPollInterval and MaxPollInterval bound a resident worker's poll.
	MinPollInterval = 10 * time.Millisecond
	MaxPollInterval = time.Hour
)

// WithDefaults fills zero fields.
func (c Config) WithDefaults() Config {
	def := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.ClaimLimit == 0 {
		c.ClaimLimit = DefaultClaimLimit
	}
	if c.BatchSize == 0 {
		c.BatchSize = min(DefaultBatchSize, c.ClaimLimit)
	}
	def(&c.Lease, DefaultLease)
	def(&c.StatementTimeout, DefaultStatementTimeout)
	def(&c.DeadlineMargin, DefaultDeadlineMargin)
	def(&c.BackoffBase, DefaultBackoffBase)
	def(&c.BackoffCap, DefaultBackoffCap)
	return c
}

// Validate reports every mistake, phrased as what to fix. The variable names
// are those functions/worker reads. It is the one place where the settings'
// ranges are checked: config.LoadWorker only parses them and reports what
// Validate finds, and New validates before it builds.
func (c Config) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.Mode != ModeLive && c.Mode != ModeTest {
		add("STRIPE_MODE=%q: set it to %q on the stage that books real money (prod) or %q on every other stage, so that events of the other mode are not booked", c.Mode, ModeLive, ModeTest)
	}
	if c.Concurrency < 1 || c.Concurrency > 64 {
		add("WORKER_CONCURRENCY=%d: must be from 1 to 64", c.Concurrency)
	}
	if err := inbox.CheckMaxAttempts(c.MaxAttempts); err != nil {
		errs = append(errs, err)
	}
	if c.ClaimLimit < 1 || c.ClaimLimit > 1000 {
		add("CLAIM_LIMIT=%d: must be from 1 to 1000", c.ClaimLimit)
	}
	if c.BatchSize < 1 || c.BatchSize > c.ClaimLimit {
		add("BATCH_SIZE=%d: must be from 1 to CLAIM_LIMIT=%d", c.BatchSize, c.ClaimLimit)
	} else if c.BatchSize > MaxBatchSize {
		add("BATCH_SIZE=%d: must be at most %d. Each receipt of a batch is a subtransaction, and PostgreSQL keeps %d per transaction in shared memory; past that, every snapshot in the database has to look subtransactions up in pg_subtrans, which slows the whole server down", c.BatchSize, MaxBatchSize, MaxBatchSize)
	}
	if c.StatementTimeout < 10*time.Millisecond || c.StatementTimeout > 15*time.Minute {
		add("STATEMENT_TIMEOUT=%s: must be from 10ms to 15m", c.StatementTimeout)
	}
	if c.Lease < time.Second || c.Lease > time.Hour {
		add("LEASE=%s: must be from 1s to 1h", c.Lease)
	} else if c.Lease <= c.StatementTimeout {
		add("LEASE=%s must be longer than STATEMENT_TIMEOUT=%s, or a receipt could be re-claimed while it is still being processed", c.Lease, c.StatementTimeout)
	} else if c.Lease < time.Duration(c.ClaimLimit)*c.StatementTimeout {
		add("LEASE=%s must be at least CLAIM_LIMIT x STATEMENT_TIMEOUT = %s, or the last receipt of a claim could outlive its lease before its turn", c.Lease, time.Duration(c.ClaimLimit)*c.StatementTimeout)
	}
	if c.DeadlineMargin < time.Second || c.DeadlineMargin > 15*time.Minute {
		add("DEADLINE_MARGIN=%s: must be from 1s to 15m", c.DeadlineMargin)
	} else if c.DeadlineMargin <= c.StatementTimeout {
		add("DEADLINE_MARGIN=%s must be longer than STATEMENT_TIMEOUT=%s, so a receipt started before the margin finishes before the invocation ends", c.DeadlineMargin, c.StatementTimeout)
	}
	if c.PollInterval != 0 && (c.PollInterval < MinPollInterval || c.PollInterval > MaxPollInterval) {
		add("POLL_INTERVAL=%s: must be 0 (return as soon as the inbox is empty; the schedule alone starts the work) or from %s to %s (stay resident until the deadline margin and look for receipts that often; default %s)", c.PollInterval, MinPollInterval, MaxPollInterval, DefaultPollInterval)
	}
	if c.Listen && c.PollInterval == 0 {
		add("LISTEN=on needs POLL_INTERVAL > 0: only a resident worker listens for receipts (set POLL_INTERVAL, e.g. %s, or LISTEN=off)", DefaultPollInterval)
	}
	if c.APIVersion != "" {
		if err := stripeevent.CheckAPIVersion(c.APIVersion); err != nil {
			add("STRIPE_API_VERSION: %v", err)
		}
	}
	if c.BackoffBase < 10*time.Millisecond || c.BackoffBase > time.Hour {
		add("BACKOFF_BASE=%s: must be from 10ms to 1h", c.BackoffBase)
	}
	if c.BackoffCap > 24*time.Hour || c.BackoffCap < c.BackoffBase {
		add("BACKOFF_BASE=%s and BACKOFF_CAP=%s: need 0 < base <= cap <= 24h", c.BackoffBase, c.BackoffCap)
	}
	return errors.Join(errs...)
}
