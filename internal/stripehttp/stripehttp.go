// Package stripehttp is the stripe-go backend that the functions calling
// Stripe's API share (the reconciler, internal/reconcile; the write-back
// sender, internal/writeback): stripe-go's request building
// (Authorization, Stripe-Version, form encoding, Idempotency-Key), its URL
// override (BackendConfig.URL: STRIPE_API_BASE) and its error decoding
// (*stripe.Error), with stripe-go's own retries, logging and telemetry off
// (each caller retries in its own way: stripe-go retries 429s without
// honouring Retry-After), and the headers of each answer that
// *stripe.Error does not keep (Retry-After, Stripe-Rate-Limited-Reason).
package stripehttp

import (
	"context"
	"net/http"
	"strconv"
	"time"

	stripe "github.com/stripe/stripe-go/v82"
)

// DefaultTimeout bounds one request when the caller gives no HTTP client.
const DefaultTimeout = 30 * time.Second

// NewBackend returns stripe-go's API backend carried by hc (nil: one with
// DefaultTimeout), at baseURL ("" is Stripe's, https://api.stripe.com),
// with MaxNetworkRetries 0 (stripe-go v82 BackendConfig). Its transport
// fills the Answer of a request whose context comes from Track.
func NewBackend(hc *http.Client, baseURL string) stripe.Backend {
	if hc == nil {
		hc = &http.Client{Timeout: DefaultTimeout}
	}
	base := hc.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	hc2 := *hc
	hc2.Transport = recorder{base}
	bc := &stripe.BackendConfig{
		HTTPClient:        &hc2,
		MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
		EnableTelemetry:   stripe.Bool(false),
	}
	if baseURL != "" {
		bc.URL = stripe.String(baseURL)
	}
	return stripe.GetBackendWithConfig(stripe.APIBackend, bc)
}

// Answer is what one request's HTTP answer said: its status (0 when none
// came: a timeout, a reset, a refused connection) and the headers that
// stripe-go's *stripe.Error does not keep.
type Answer struct {
	Status int
	// RetryAfter is the Retry-After header (https://docs.stripe.com/rate-limits).
	RetryAfter string
	// RateLimitedReason is the Stripe-Rate-Limited-Reason header of a 429.
	RateLimitedReason string
	// RequestID is Stripe's Request-Id header.
	RequestID string
	// Replayed: the answer is the saved result of an earlier request with
	// the same idempotency key (Idempotent-Replayed: true,
	// https://docs.stripe.com/api/idempotent_requests).
	Replayed bool
}

type answerKey struct{}

// Track returns a context for one request (stripe.Params.Context) and the
// Answer the backend's transport fills.
func Track(ctx context.Context) (context.Context, *Answer) {
	a := &Answer{}
	return context.WithValue(ctx, answerKey{}, a), a
}

// RetryAfterDelay is Retry-After as a delay (whole seconds, the form Stripe
// sends); ok is false when the answer had none or not a number.
func (a *Answer) RetryAfterDelay() (d time.Duration, ok bool) {
	secs, err := strconv.Atoi(a.RetryAfter)
	if err != nil || secs < 0 {
		return 0, false
	}
	return time.Duration(secs) * time.Second, true
}

type recorder struct{ base http.RoundTripper }

func (r recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	res, err := r.base.RoundTrip(req)
	if a, ok := req.Context().Value(answerKey{}).(*Answer); ok && res != nil {
		a.Status = res.StatusCode
		a.RetryAfter = res.Header.Get("Retry-After")
		a.RateLimitedReason = res.Header.Get("Stripe-Rate-Limited-Reason")
		a.RequestID = res.Header.Get("Request-Id")
		a.Replayed = res.Header.Get("Idempotent-Replayed") == "true"
	}
	return res, err
}
