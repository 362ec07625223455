package outbox

import (
	"errors"
	"fmt"
	"regexp"
	"time"
)

// Defaults and ranges of Config. Each range is checked here only
// (Config.Validate); internal/config parses the environment into a Config.
const (
	DefaultSource      = "stripe-inbox"
	DefaultMaxAttempts = 10
	DefaultClaimLimit  = 50
	DefaultLease       = 2 * time.Minute
	DefaultCallTimeout = 5 * time.Second
	DefaultBackoffBase = time.Second
	DefaultBackoffCap  = 5 * time.Minute
	DefaultEvery       = 2 * time.Second
)

// Config is the relay's configuration.
type Config struct {
	// Bus is the name (or ARN) of the EventBridge event bus to publish to.
	Bus string
	// Source is every entry's Source (default stripe-inbox).
	Source string
	// MaxAttempts is how many times a row is tried before it waits for a
	// human (1-1000, default 10). Throttled calls and calls that fail as a
	// whole do not count.
	MaxAttempts int
	// ClaimLimit is how many rows one claim takes (1-1000, default 50);
	// they are published in calls of at most 10 entries and 256 KB.
	ClaimLimit int
	// Lease is how long a claim hides its rows from other relays (1s-1h,
	// default 2m). It must exceed the time to publish a whole claim:
	// ⌈ClaimLimit/10⌉ calls × CallTimeout.
	Lease time.Duration
	// CallTimeout bounds each PutEvents call, the SDK's retries included
	// (100ms-1m, default 5s).
	CallTimeout time.Duration
	// BackoffBase and BackoffCap shape the delays: a failed entry is due
	// again after min(cap, base·2^(attempts−1)), and after throttling or a
	// failed call the relay pauses min(cap, base·2^(n−1)) for the n-th in a
	// row; both jittered to 50-100 %. Base 10ms-1h (default 1s), cap
	// 10ms-24h (default 5m), cap ≥ base.
	BackoffBase, BackoffCap time.Duration
	// Every is how often a resident worker runs the relay while it is idle
	// (10ms-1h, default 2s); it also runs it after each round that drained
	// receipts, and once at the end of each invocation.
	Every time.Duration
}

// WithDefaults fills the zero fields.
func (c Config) WithDefaults() Config {
	if c.Source == "" {
		c.Source = DefaultSource
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.ClaimLimit == 0 {
		c.ClaimLimit = DefaultClaimLimit
	}
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	if c.CallTimeout == 0 {
		c.CallTimeout = DefaultCallTimeout
	}
	if c.BackoffBase == 0 {
		c.BackoffBase = DefaultBackoffBase
	}
	if c.BackoffCap == 0 {
		c.BackoffCap = DefaultBackoffCap
	}
	if c.Every == 0 {
		c.Every = DefaultEvery
	}
	return c
}

// CheckMaxAttempts checks OUTBOX_MAX_ATTEMPTS (1-1000), for the relay and
// for the ops function, which must agree with it on which rows wait for a
// human.
func CheckMaxAttempts(n int) error {
	if n < 1 || n > 1000 {
		return fmt.Errorf("OUTBOX_MAX_ATTEMPTS=%d: must be from 1 to 1000 (default %d)", n, DefaultMaxAttempts)
	}
	return nil
}

// busName: an event bus name (letters, digits, . - _ /, up to 256) or an
// event bus ARN.
var busName = regexp.MustCompile(`^([A-Za-z0-9._\-/]{1,256}|arn:aws[a-z-]*:events:[a-z0-9-]+:\d{12}:event-bus/[A-Za-z0-9._\-/]{1,256})$`)

// Validate reports every setting out of range, naming its variable.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if !busName.MatchString(c.Bus) {
		bad("OUTBOX_BUS=%q: must be an event bus name (letters, digits, . - _ /) or ARN (the stack sets it to its bus)", c.Bus)
	}
	if c.Source == "" || len(c.Source) > 256 {
		bad("OUTBOX_SOURCE=%q: must be 1-256 characters (default %s)", c.Source, DefaultSource)
	}
	rangeInt := func(name string, v, lo, hi, def int) {
		if v < lo || v > hi {
			bad("%s=%d: must be from %d to %d (default %d)", name, v, lo, hi, def)
		}
	}
	rangeDur := func(name string, v, lo, hi, def time.Duration) {
		if v < lo || v > hi {
			bad("%s=%s: must be from %s to %s (default %s)", name, v, lo, hi, def)
		}
	}
	if err := CheckMaxAttempts(c.MaxAttempts); err != nil {
		errs = append(errs, err)
	}
	rangeInt("OUTBOX_CLAIM_LIMIT", c.ClaimLimit, 1, 1000, DefaultClaimLimit)
	rangeDur("OUTBOX_LEASE", c.Lease, time.Second, time.Hour, DefaultLease)
	rangeDur("OUTBOX_CALL_TIMEOUT", c.CallTimeout, 100*time.Millisecond, time.Minute, DefaultCallTimeout)
	rangeDur("OUTBOX_BACKOFF_BASE", c.BackoffBase, 10*time.Millisecond, time.Hour, DefaultBackoffBase)
	rangeDur("OUTBOX_BACKOFF_CAP", c.BackoffCap, 10*time.Millisecond, 24*time.Hour, DefaultBackoffCap)
	rangeDur("OUTBOX_EVERY", c.Every, 10*time.Millisecond, time.Hour, DefaultEvery)
	if c.BackoffCap < c.BackoffBase {
		bad("OUTBOX_BACKOFF_CAP=%s must be at least OUTBOX_BACKOFF_BASE=%s", c.BackoffCap, c.BackoffBase)
	}
	calls := (c.ClaimLimit + MaxEntriesPerCall - 1) / MaxEntriesPerCall
	if c.ClaimLimit > 0 && c.Lease <= time.Duration(calls)*c.CallTimeout {
		bad("OUTBOX_LEASE=%s must exceed the time to publish a claim, ⌈OUTBOX_CLAIM_LIMIT/10⌉ × OUTBOX_CALL_TIMEOUT = %d × %s, or another relay may take rows over while they are published", c.Lease, calls, c.CallTimeout)
	}
	return errors.Join(errs...)
}
