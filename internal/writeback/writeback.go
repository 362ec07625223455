// Package writeback sends write-backs to Stripe exactly once: calls to the
// Stripe API a booking asked for (docs/writebacks.md), recorded as intents in
// writeback_intents in the booking's transaction (internal/handlers).
//
// The Sender claims due intents with a lease and a fencing token, as the
// outbox relay does (one autocommit statement counts the attempt and stamps
// the first one), calls Stripe with the intent's Idempotency-Key, and
// records the result (the object's id and what Stripe answered) against the
// claim's token. A recorded intent is never claimed, so never called,
// again. A sender that stalled past its lease cannot record over the claim
// that owns the intent now.
//
// What each answer does:
//
//   - 2xx: done (result_via call).
//   - no answer (timeout, reset, refused), 5xx, 409 (the key in use by a
//     concurrent request): ambiguous, the call may have run. Retried after a
//     backoff with the same key: Stripe replays the first result of a key it
//     knows instead of running the request again
//     (https://docs.stripe.com/api/idempotent_requests). At MaxAttempts the
//     intent is parked.
//   - 429: given back with its attempt uncounted, due after Stripe's
//     Retry-After or the backoff, whichever is longer, and the sender pauses
//     (as the reconciler, internal/reconcile.Client, backs off).
//   - 401, 403: the key is wrong; given back uncounted and the run stops (a
//     configuration problem parks nothing).
//   - 400 idempotency_error (the key reused with other parameters: an
//     earlier request with the key ran): parked as not refused, so an
//     operator's retry keeps the key.
//   - any other 4xx (the customer does not exist, a parameter refused):
//     retrying cannot fix it, Stripe changed nothing; parked as refused for
//     a human (inboxctl writebacks, writeback-retry: a retry sends under the
//     key's next generation).
//
// The key's lifetime: Stripe may remove a key once it is at least 24 hours
// old, and a request with a removed key runs as a new request (same page).
// So an intent whose first attempt is older than KeyLifetime is not sent
// blindly: the sender first reads the effect back (GET the customer: the
// metadata already holds the values) and records that (result_via
// read_back); only when the effect is not there does it send, which is then
// correct whether or not Stripe still knows the key. And an intent for which
// a newer intent of the same kind and target is pending or done (not parked,
// not itself superseded) is recorded as superseded without a call: sending
// it would put the older value back. A batch is applied in id order.
package writeback

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	mrand "math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/metrics"

	stripe "github.com/stripe/stripe-go/v82"
)

// Defaults.
const (
	DefaultClaimLimit  = 10
	DefaultLease       = 2 * time.Minute
	DefaultCallTimeout = 20 * time.Second
	DefaultMaxAttempts = 25
	DefaultBackoffBase = 10 * time.Second
	DefaultBackoffCap  = time.Hour
	// KeyLifetime is how long Stripe keeps an idempotency key at least:
	// "Keys are eligible to be removed from the system automatically after
	// they're at least 24 hours old"
	// (https://docs.stripe.com/api/idempotent_requests).
	KeyLifetime = 24 * time.Hour
)

// Config is the sender's configuration.
//
// The lease bounds a batch: an intent is sent only while at least
// 2 × CallTimeout (its worst case: a read-back and the call) of its claim's
// lease remains, measured on the sender's clock from before the claim; the
// intents of a batch that no longer fit are given back uncounted and
// claimed again with a fresh lease. So a batch's worst case,
// ClaimLimit × 2 × CallTimeout (400 s with the defaults), may exceed the
// lease (2 minutes): Validate requires only that one intent fits.
type Config struct {
	ClaimLimit  int
	Lease       time.Duration
	CallTimeout time.Duration
	MaxAttempts int
	BackoffBase time.Duration
	BackoffCap  time.Duration
	// KeyLifetime: an intent whose first attempt is older is read back
	// before it is sent (default KeyLifetime; tests shorten it).
	KeyLifetime time.Duration
}

// WithDefaults fills unset fields.
func (c Config) WithDefaults() Config {
	if c.ClaimLimit <= 0 {
		c.ClaimLimit = DefaultClaimLimit
	}
	if c.Lease <= 0 {
		c.Lease = DefaultLease
	}
	if c.CallTimeout <= 0 {
		c.CallTimeout = DefaultCallTimeout
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.BackoffBase <= 0 {
		c.BackoffBase = DefaultBackoffBase
	}
	if c.BackoffCap <= 0 {
		c.BackoffCap = DefaultBackoffCap
	}
	if c.KeyLifetime <= 0 {
		c.KeyLifetime = KeyLifetime
	}
	return c
}

// Validate reports a setting that cannot work.
func (c Config) Validate() error {
	if c.Lease < 2*c.CallTimeout {
		return fmt.Errorf("write-back lease %s must be at least twice the call timeout %s: an intent must stay claimed while its calls (a read-back and the call) run", c.Lease, c.CallTimeout)
	}
	if c.BackoffCap < c.BackoffBase {
		return fmt.Errorf("write-back backoff cap %s is below the base %s", c.BackoffCap, c.BackoffBase)
	}
	return nil
}

// Sender sends write-backs. One Run goes on at a time per Sender.
type Sender struct {
	store   Store
	api     API
	cfg     Config
	logger  *slog.Logger
	metrics *metrics.Emitter

	// Jitter returns a number in [0, 1); math/rand by default.
	Jitter func() float64
	// Clock is the sender's clock for its pause (time.Now by default).
	Clock func() time.Time

	mu          sync.Mutex
	pausedUntil time.Time
	throttled   int // 429s in a row
}

// New returns a Sender.
func New(store Store, api API, cfg Config, logger *slog.Logger, em *metrics.Emitter) (*Sender, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Sender{store: store, api: api, cfg: cfg, logger: logger, metrics: em, Jitter: mrand.Float64, Clock: time.Now}, nil
}

// Summary is what Run did.
type Summary struct {
	Claimed    int  `json:"claimed"`
	Calls      int  `json:"calls"`       // POSTs sent
	ReadBacks  int  `json:"read_backs"`  // GETs sent
	Done       int  `json:"done"`        // results recorded
	Retried    int  `json:"retried"`     // ambiguous failures, due again
	Throttled  int  `json:"throttled"`   // 429s
	Parked     int  `json:"parked"`      // waiting for a human
	Fenced     int  `json:"fenced"`      // outcomes another claim owned by then
	Superseded int  `json:"superseded"`  // recorded without a call
	LeaseShort int  `json:"lease_short"` // given back unsent: too little of the lease left
	Paused     bool `json:"paused"`      // the run found the sender pausing after a 429
	KeyRefused bool `json:"key_refused"` // Stripe refused the API key
}

// Run sends due intents, claim after claim, until a claim comes back short,
// ctx ends, or Stripe throttles or refuses the key. It returns an error only
// when the store could not be used.
func (s *Sender) Run(ctx context.Context) (Summary, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var sum Summary
	if s.Clock().Before(s.pausedUntil) {
		sum.Paused = true
		return sum, nil
	}
	for ctx.Err() == nil {
		// The lease's end on the sender's clock, from before the claim: no
		// later than the database's, but for clock skew.
		leaseEnd := s.Clock().Add(s.cfg.Lease)
		token, intents, err := s.claim(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return sum, nil
			}
			return sum, err
		}
		sum.Claimed += len(intents)
		// In id order: the order the bookings were recorded in.
		slices.SortFunc(intents, func(a, b Intent) int { return cmp.Compare(a.ID, b.ID) })
		stop := false
		for _, in := range intents {
			var o Outcome
			if stop {
				// Due when the sender's pause ends (after a 429), not at
				// once: another sender would only be throttled too.
				o = Outcome{ID: in.ID, Kind: Release, Error: "not sent: the run stopped (throttled, key refused or out of time)",
					Delay: max(s.pausedUntil.Sub(s.Clock()), 0)}
			} else if s.Clock().Add(2 * s.cfg.CallTimeout).After(leaseEnd) {
				// Too little of the lease is left for the calls: another
				// sender could claim the intent while its call runs. Given
				// back uncounted; the next claim has a fresh lease.
				sum.LeaseShort++
				o = Outcome{ID: in.ID, Kind: Release, Error: "not sent: less than twice the call timeout was left of the lease"}
			} else {
				o = s.send(ctx, in, &sum)
				stop = o.Kind == Release
			}
			if err := s.record(ctx, token, in, o, &sum); err != nil {
				return sum, err
			}
		}
		if stop || len(intents) < s.cfg.ClaimLimit {
			break
		}
	}
	if sum.Claimed > 0 {
		s.logger.InfoContext(ctx, "write-backs", "summary", sum)
	}
	return sum, nil
}

// claim claims due intents on a context that outlives ctx (bounded as
// record's): a claim the store committed is always read, even when ctx ends
// while its answer is on the way, and its intents are then given back at
// once (a call on an ended ctx fails, and failed releases it; the rest are
// released unsent). Cancelled halfway, the answer would be dropped and the
// intents would stay leased, to nobody, for the lease. Run checks ctx
// before each claim.
func (s *Sender) claim(ctx context.Context) (string, []Intent, error) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	return s.store.Claim(cctx, s.cfg.ClaimLimit, s.cfg.Lease, s.cfg.KeyLifetime)
}

// record records o; a record made after ctx ended still runs (the call
// happened: its result is wanted).
func (s *Sender) record(ctx context.Context, token string, in Intent, o Outcome, sum *Summary) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	n, err := s.store.Record(rctx, token, s.cfg.MaxAttempts, []Outcome{o})
	if err != nil {
		return err
	}
	if n == 0 {
		sum.Fenced++
		s.logger.WarnContext(ctx, "write-back: the intent was claimed again after this sender's lease ended; its outcome is left to that claim", "intent", in.ID, "outcome", o.Kind)
		return nil
	}
	switch o.Kind {
	case Done:
		sum.Done++
		if o.Via == ViaSuperseded {
			sum.Superseded++
		}
	case Retry:
		sum.Retried++
		if in.Attempts >= s.cfg.MaxAttempts {
			sum.Parked++
			s.logger.ErrorContext(ctx, "write-back used up its attempts and waits for review", "intent", in.ID, "error", o.Error)
		}
	case Park:
		sum.Parked++
		s.logger.ErrorContext(ctx, "write-back refused by Stripe; waits for review", "intent", in.ID, "kind", in.Kind, "target", in.Target, "error", o.Error)
	}
	return nil
}

// customerMetadataParams are a customer_metadata intent's params.
type customerMetadataParams struct {
	Metadata map[string]string `json:"metadata"`
}

// send makes the calls of one intent and says what to record.
func (s *Sender) send(ctx context.Context, in Intent, sum *Summary) Outcome {
	if in.Superseded {
		return Outcome{ID: in.ID, Kind: Done, Via: ViaSuperseded, ResultID: in.Target,
			Result: json.RawMessage(`{"superseded":"a newer write-back of the same kind and target was recorded first"}`)}
	}
	switch in.Kind {
	case handlers.WritebackCustomerMetadata:
		var p customerMetadataParams
		if err := json.Unmarshal(in.Params, &p); err != nil || len(p.Metadata) == 0 {
			return Outcome{ID: in.ID, Kind: Park, Error: fmt.Sprintf("params %s: not {\"metadata\": {...}}", in.Params)}
		}
		if in.ReadBackFirst {
			if o, found := s.readBack(ctx, in, p.Metadata, sum); found || o.Kind != "" {
				return o
			}
			// Not in effect: sending is right whether Stripe still knows
			// the key (it replays a failure, handled below) or not.
		}
		sum.Calls++
		cctx, cancel := context.WithTimeout(ctx, s.cfg.CallTimeout)
		cu, err := s.api.UpdateCustomerMetadata(cctx, in.Target, p.Metadata, in.Key)
		cancel()
		if err != nil {
			var ce *CallError
			if errors.As(err, &ce) && ce.Replayed && ce.Status >= 500 && ctx.Err() == nil {
				// Stripe saved this 5xx under the key (the first request
				// with it began to run, then failed) and replays it for as
				// long as it keeps the key ("Subsequent requests with the
				// same key return the same result, including 500 errors",
				// https://docs.stripe.com/api/idempotent_requests):
				// retrying with the key cannot get another answer. Read the
				// effect back now instead.
				o, found := s.readBack(ctx, in, p.Metadata, sum)
				if found || o.Kind != "" {
					return o
				}
				// Not in effect: the run changed nothing that stayed, and
				// setting the metadata under a new key cannot apply twice
				// what is not there. Parked as refused: an operator's retry
				// sends under the key's next generation.
				s.throttled = 0
				return Outcome{ID: in.ID, Kind: Park, Error: fmt.Sprintf(
					"POST /v1/customers/%s: Stripe replays a saved %d for this key (Idempotent-Replayed) and the read-back shows the metadata not in effect; a retry sends under the next key generation: %v",
					in.Target, ce.Status, err)}
			}
			return s.failed(ctx, in, "POST /v1/customers/"+in.Target, err, sum)
		}
		s.throttled = 0
		return Outcome{ID: in.ID, Kind: Done, Via: ViaCall, ResultID: cu.ID, Result: effect(cu, p.Metadata)}
	default:
		return Outcome{ID: in.ID, Kind: Park, Error: fmt.Sprintf("kind %q: this release does not know it", in.Kind)}
	}
}

// readBack reads the customer (GET) and reports whether want is in effect:
// then o records it (result_via read_back). When the read failed, o says
// what to record instead; when it is not in effect, o is empty.
func (s *Sender) readBack(ctx context.Context, in Intent, want map[string]string, sum *Summary) (o Outcome, found bool) {
	sum.ReadBacks++
	cctx, cancel := context.WithTimeout(ctx, s.cfg.CallTimeout)
	cu, err := s.api.GetCustomer(cctx, in.Target)
	cancel()
	if err != nil {
		return s.failed(ctx, in, "reading back GET /v1/customers/"+in.Target, err, sum), false
	}
	s.throttled = 0
	if contains(cu.Metadata, want) {
		return Outcome{ID: in.ID, Kind: Done, Via: ViaReadBack, ResultID: cu.ID, Result: effect(cu, want)}, true
	}
	return Outcome{}, false
}

// effect is what an intent's result keeps: what identifies the effect (the
// customer's id, the metadata keys the intent set with the values Stripe
// answered, Stripe's request id, whether the answer was a replay), not the
// customer (email, name, address: personal data).
func effect(cu Customer, set map[string]string) json.RawMessage {
	md := make(map[string]string, len(set))
	for k := range set {
		md[k] = cu.Metadata[k]
	}
	b, _ := json.Marshal(struct {
		ID        string            `json:"id"`
		Metadata  map[string]string `json:"metadata"`
		RequestID string            `json:"request_id,omitempty"`
		Replayed  bool              `json:"replayed"`
	}{cu.ID, md, cu.RequestID, cu.Replayed})
	return b
}

// failed classifies a failed call.
func (s *Sender) failed(ctx context.Context, in Intent, what string, err error, sum *Summary) Outcome {
	msg := what + ": " + err.Error()
	if ctx.Err() != nil {
		// The run ended during the call: it may or may not have run. Give
		// it back uncounted; the next run sends it with the same key.
		return Outcome{ID: in.ID, Kind: Release, Error: "run ended during the call: " + msg}
	}
	var (
		ce *CallError
		se *stripe.Error
	)
	status := 0
	var retryAfter time.Duration
	if errors.As(err, &ce) {
		status, retryAfter = ce.Status, ce.RetryAfter
	}
	switch {
	case status == http.StatusTooManyRequests:
		sum.Throttled++
		s.throttled++
		d := max(s.backoff(s.throttled), retryAfter)
		s.pausedUntil = s.Clock().Add(d)
		s.logger.WarnContext(ctx, "write-back throttled by Stripe; pausing", "intent", in.ID, "retry_after", retryAfter.String(), "pause_ms", d.Milliseconds())
		return Outcome{ID: in.ID, Kind: Release, Error: "throttled: " + msg, Delay: d}
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		sum.KeyRefused = true
		s.logger.ErrorContext(ctx, "Stripe refused the write-back API key; store a key with Customers: Write", "status", status)
		return Outcome{ID: in.ID, Kind: Release, Error: "key refused: " + msg, Delay: s.backoff(1)}
	case status == http.StatusBadRequest && errors.As(err, &se) && se.Type == stripe.ErrorTypeIdempotency:
		// The key was used before with other parameters: that earlier
		// request ran (Stripe compares parameters only for a key it saved a
		// result under), so Stripe may have changed something. Not a
		// refusal: parked with the key kept, for a human to look
		// (https://docs.stripe.com/api/idempotent_requests: "The
		// idempotency layer compares incoming parameters to those of the
		// original request and errors if they're not the same").
		s.throttled = 0
		return Outcome{ID: in.ID, Kind: Park, MayHaveRun: true,
			Error: "idempotency_error (the key was used before with other parameters; that request ran, check the target): " + msg}
	case status == 0, status >= 500, status == http.StatusConflict:
		s.throttled = 0
		return Outcome{ID: in.ID, Kind: Retry, Error: msg, Delay: s.backoff(in.Attempts)}
	default:
		s.throttled = 0
		return Outcome{ID: in.ID, Kind: Park, Error: msg}
	}
}

// backoff is min(cap, base·2^(n−1)), jittered to 50-100 %.
func (s *Sender) backoff(n int) time.Duration {
	exp := math.Pow(2, float64(max(n-1, 0)))
	d := time.Duration(math.Min(float64(s.cfg.BackoffCap), float64(s.cfg.BackoffBase)*exp))
	return time.Duration(float64(d) * (0.5 + s.Jitter()/2))
}

func contains(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

// EmitBacklog reads the backlog (from the database, DBStore, or through the
// store function, RemoteStore) and writes its gauges (only when read: a
// missing gauge alarms, a made-up zero would not).
func EmitBacklog(ctx context.Context, r BacklogReader, em *metrics.Emitter) (Backlog, error) {
	b, err := r.Backlog(ctx)
	if err != nil {
		return b, err
	}
	return b, em.Emit(nil,
		metrics.Metric{Name: "WritebacksPending", Value: float64(b.Pending), Unit: metrics.Count},
		metrics.Metric{Name: "WritebacksOldestAgeSeconds", Value: b.OldestAgeSeconds, Unit: metrics.Seconds},
		metrics.Metric{Name: "WritebacksParked", Value: float64(b.Parked), Unit: metrics.Count})
}
