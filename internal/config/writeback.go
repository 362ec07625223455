package config

import (
	"fmt"
	"strings"
	"time"

	"github.com/stripe-inbox/inbox/internal/writeback"
)

// LocalWriteback is the local runner's write-back sender: on when the
// worker runs with WRITEBACKS set (docs/writebacks.md).
type LocalWriteback struct {
	Enabled  bool
	Client   writeback.ClientConfig
	Sender   writeback.Config
	Interval time.Duration
}

// loadLocalWriteback reads, when the worker runs with write-backs on,
// STRIPE_API_KEY (required: a key with Customers: Write), STRIPE_API_BASE
// (the API's base URL, default Stripe's; a stand-in's in tests) and
// WRITEBACK_INTERVAL (default 2s: how often the sender runs), and the
// sender's WRITEBACK_CLAIM_LIMIT (10), WRITEBACK_LEASE (2m),
// WRITEBACK_CALL_TIMEOUT (20s; the lease is at least twice it), WRITEBACK_MAX_ATTEMPTS
// (25), WRITEBACK_BACKOFF_BASE (10s) and WRITEBACK_BACKOFF_CAP (1h), as the
// outbox relay's OUTBOX_* settings (the fault suite shortens them so that a
// killed worker's claims come back in seconds).
func (p *problems) loadLocalWriteback(env Env, l *Local) {
	if !l.Runs("worker") || len(l.Worker.Handlers.Writebacks) == 0 {
		return
	}
	w := LocalWriteback{Enabled: true}
	w.Client.Key = strings.TrimSpace(env("STRIPE_API_KEY"))
	w.Client.BaseURL = strings.TrimSpace(env("STRIPE_API_BASE"))
	if w.Client.Key == "" {
		p.addf("WRITEBACKS=%s but STRIPE_API_KEY is not set: the write-back sender needs a Stripe API key with Customers: Write (sk_test_... or rk_test_...), or set WRITEBACKS=off",
			strings.Join(l.Worker.Handlers.Writebacks, ","))
	}
	if w.Client.BaseURL != "" && !strings.HasPrefix(w.Client.BaseURL, "http://") && !strings.HasPrefix(w.Client.BaseURL, "https://") {
		p.addf("STRIPE_API_BASE=%q: must be an http(s) URL such as https://api.stripe.com or a stand-in's http://127.0.0.1:PORT", w.Client.BaseURL)
	}
	w.Interval = p.durationIn(env, "WRITEBACK_INTERVAL", 2*time.Second, 10*time.Millisecond, time.Hour)
	w.Sender = writeback.Config{
		ClaimLimit:  p.intIn(env, "WRITEBACK_CLAIM_LIMIT", writeback.DefaultClaimLimit, 1, 100),
		Lease:       p.durationIn(env, "WRITEBACK_LEASE", writeback.DefaultLease, time.Second, time.Hour),
		CallTimeout: p.durationIn(env, "WRITEBACK_CALL_TIMEOUT", writeback.DefaultCallTimeout, 100*time.Millisecond, time.Minute),
		MaxAttempts: p.intIn(env, "WRITEBACK_MAX_ATTEMPTS", writeback.DefaultMaxAttempts, 1, 100),
		BackoffBase: p.durationIn(env, "WRITEBACK_BACKOFF_BASE", writeback.DefaultBackoffBase, 10*time.Millisecond, time.Hour),
		BackoffCap:  p.durationIn(env, "WRITEBACK_BACKOFF_CAP", writeback.DefaultBackoffCap, 10*time.Millisecond, 24*time.Hour),
	}.WithDefaults()
	if err := w.Sender.Validate(); err != nil {
		p.addf("WRITEBACK_LEASE, WRITEBACK_CALL_TIMEOUT, WRITEBACK_BACKOFF_BASE, WRITEBACK_BACKOFF_CAP: %v", err)
	}
	l.Writeback = w
}

// String is the line the local runner prints.
func (w LocalWriteback) String() string {
	base := w.Client.BaseURL
	if base == "" {
		base = "https://api.stripe.com"
	}
	return fmt.Sprintf("write-back sender running every %s against %s (WRITEBACKS, STRIPE_API_BASE)", w.Interval, base)
}

// Writeback is the writeback function's configuration: the sender outside
// the VPC (it reaches Stripe), which hands its store operations to the
// writebackstore function (STORE_FUNCTION), or a run that stores through
// DATABASE_URL.
type Writeback struct {
	StripeCaller
	Client writeback.ClientConfig // Key is filled once fetched
	Sender writeback.Config
	// DeadlineMargin: the run stops claiming this long before the
	// invocation's deadline (DEADLINE_MARGIN).
	DeadlineMargin time.Duration
}

// WritebackStore is the writebackstore function's configuration.
type WritebackStore struct {
	Common
	// SenderRoleARN is the writeback function's role (WRITEBACK_ROLE_ARN):
	// the only principal whose requests it serves (internal/invokeproof).
	SenderRoleARN string
}

// LoadWriteback reads:
//   - the key: STRIPE_API_KEY_SECRET_ARN (AWS: a Secrets Manager secret
//     holding a restricted key with Customers: Write) or STRIPE_API_KEY
//     (local), exactly one; STRIPE_MODE (optional: live or test) must match
//     the key's mode;
//   - STRIPE_API_BASE (default https://api.stripe.com; a stand-in in tests);
//   - where the intents are: STORE_FUNCTION (AWS) or DATABASE_URL, exactly
//     one;
//   - WRITEBACK_MAX_ATTEMPTS (default 25; 1 to 100), DEADLINE_MARGIN
//     (default 15s; 1s to 5m: longer than the call timeout, 20s by
//     default, is not needed: a call cut short is given back uncounted),
//     SECRET_FETCH_TIMEOUT (2s), the metrics settings.
func LoadWriteback(env Env) (Writeback, error) {
	var p problems
	c := Writeback{StripeCaller: p.stripeCaller(env, "writeback", "; a restricted key with Customers: Write")}
	c.Client.BaseURL = p.stripeAPIBase(env)
	p.storeOrDatabase(env, &c.StripeCaller, "the writebackstore function", "no write-back store", "inbox-writeback")
	c.Sender = writeback.Config{MaxAttempts: p.intIn(env, "WRITEBACK_MAX_ATTEMPTS", writeback.DefaultMaxAttempts, 1, 100)}.WithDefaults()
	p.addErr("", c.Sender.Validate())
	c.DeadlineMargin = p.durationIn(env, "DEADLINE_MARGIN", 15*time.Second, time.Second, 5*time.Minute)
	return c, p.err()
}

// LoadWritebackStore reads WRITEBACK_ROLE_ARN (required: the writeback
// function's role, whose proofs it admits; the STS endpoint it verifies
// them with is the SDK's, see invokeproof.Endpoint) and the database
// settings.
func LoadWritebackStore(env Env) (WritebackStore, error) {
	var p problems
	c := WritebackStore{Common: p.common(env, "writebackstore", 2)}
	c.SenderRoleARN = p.callerRole(env, "WRITEBACK_ROLE_ARN", "the write-back store function", "the writeback function's role")
	return c, p.err()
}
