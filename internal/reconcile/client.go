package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	stripe "github.com/stripe/stripe-go/v82"
	"github.com/stripe/stripe-go/v82/form"

	"github.com/stripe-inbox/inbox/internal/stripehttp"
)

// Stripe's read rate limits (https://docs.stripe.com/rate-limits): 100
// read requests per second in live mode, 25 in test mode (sandboxes), shared
// by every client of the account. The reconciler's default stays well under
// the test-mode limit so that the application's own API calls keep most of
// the budget.
const (
	LiveReadLimit = 100
	TestReadLimit = 25
	// DefaultRate is the reconciler's default request rate (requests/s).
	DefaultRate = 5
	// MaxTypesPerRequest is Stripe's limit on types[] (EventListParams.Types:
	// "An array of up to 20 strings").
	MaxTypesPerRequest = 20
	// PageLimit is the largest page Stripe returns (limit, 1 to 100).
	PageLimit = 100
)

// Query is one request for a page of events: created in [Since, Until)
// (whole seconds, as Stripe's created), of Types, after the event
// StartingAfter in the list's newest-first order, or just before the event
// EndingBefore (the events newer than it, nearest first in the list; each
// page is still newest first: https://docs.stripe.com/api/pagination).
type Query struct {
	Types         []string
	Since, Until  time.Time
	StartingAfter string
	EndingBefore  string
	Limit         int
}

// Page is one page of listed events, each the event's JSON as Stripe
// returned it.
type Page struct {
	Events  []json.RawMessage
	HasMore bool
}

// Lister lists pages of events (the Client, or a stand-in in tests).
type Lister interface {
	ListPage(ctx context.Context, q Query) (Page, error)
}

// ClientConfig configures a Client.
type ClientConfig struct {
	// Key is a restricted key with read access to events (rk_...), or a
	// secret key.
	Key string
	// BaseURL is the API's base URL (STRIPE_API_BASE); "" is Stripe's
	// (https://api.stripe.com).
	BaseURL string
	// Rate bounds the requests per second (default DefaultRate).
	Rate float64
	// MaxAttempts bounds the attempts of one page (429, 5xx, network
	// errors); default 8.
	MaxAttempts int
	// BackoffBase and BackoffCap: the delay before attempt n+1 is
	// min(cap, base·2^(n-1)) jittered to 50–100 %, or the Retry-After
	// Stripe sent, whichever is longer. Defaults 1s and 30s.
	BackoffBase, BackoffCap time.Duration
	// HTTPClient carries the requests (default: 30 s timeout,
	// stripehttp.NewBackend).
	HTTPClient *http.Client
	Logger     *slog.Logger
	// Sleep waits d or until ctx ends (default: a timer). Tests record the
	// delays instead of waiting them.
	Sleep func(ctx context.Context, d time.Duration) error
	// RefetchKey, when set, fetches the API key again (from Secrets
	// Manager). After a 401 the client calls it once and, when the key
	// changed (an operator rolled it), uses the new one from then on: a
	// rolled key works without waiting for a cold start.
	RefetchKey func(ctx context.Context) (string, error)
}

// Client lists events with stripe-go's backend: its request building
// (Authorization, Stripe-Version, form encoding of EventListParams), its
// URL override (BackendConfig.URL) and its error decoding (*stripe.Error),
// with stripe-go's own retries off (MaxNetworkRetries 0: stripe-go retries
// 429s itself, without honouring Retry-After, and would multiply our
// attempts), and this client's rate limit and backoff instead.
//
// The page is decoded into json.RawMessage per event rather than
// stripe.Event: the inbox stores each event's exact JSON, rendered in the
// API version it was created with, and stripe.Event would re-encode it in
// stripe-go's shape.
type Client struct {
	backend stripe.Backend
	cfg     ClientConfig

	mu   sync.Mutex
	next time.Time // earliest start of the next request
	key  string    // cfg.Key, or the key RefetchKey returned
}

// NewClient builds a Client.
func NewClient(cfg ClientConfig) (*Client, error) {
	if cfg.Key == "" {
		return nil, errors.New("reconcile: no Stripe API key")
	}
	if cfg.Rate <= 0 {
		cfg.Rate = DefaultRate
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 8
	}
	if cfg.BackoffBase <= 0 {
		cfg.BackoffBase = time.Second
	}
	if cfg.BackoffCap <= 0 {
		cfg.BackoffCap = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Sleep == nil {
		cfg.Sleep = sleep
	}
	return &Client{backend: stripehttp.NewBackend(cfg.HTTPClient, cfg.BaseURL), cfg: cfg, key: cfg.Key}, nil
}

// rawList is a page of /v1/events with each event kept as raw JSON. It
// satisfies stripe.LastResponseSetter through stripe.APIResource.
type rawList struct {
	stripe.APIResource
	Object  string            `json:"object"`
	Data    []json.RawMessage `json:"data"`
	HasMore bool              `json:"has_more"`
}

// ListPage fetches one page, waiting for the rate limit and retrying 429s,
// 5xx and network errors with backoff. Other errors (a bad key, a refused
// parameter) are returned at once.
func (c *Client) ListPage(ctx context.Context, q Query) (Page, error) {
	params := &stripe.EventListParams{
		CreatedRange: &stripe.RangeQueryParams{
			GreaterThanOrEqual: q.Since.Unix(),
			LesserThan:         q.Until.Unix(),
		},
	}
	limit := q.Limit
	if limit <= 0 || limit > PageLimit {
		limit = PageLimit
	}
	params.Limit = stripe.Int64(int64(limit))
	if q.StartingAfter != "" {
		params.StartingAfter = stripe.String(q.StartingAfter)
	}
	if q.EndingBefore != "" {
		params.EndingBefore = stripe.String(q.EndingBefore)
	}
	for _, t := range q.Types {
		params.Types = append(params.Types, stripe.String(t))
	}
	body := &form.Values{}
	form.AppendTo(body, params)

	refetched := false
	for attempt := 1; ; attempt++ {
		if err := c.waitTurn(ctx); err != nil {
			return Page{}, err
		}
		actx, info := stripehttp.Track(ctx)
		p := &stripe.Params{Context: actx}
		var list rawList
		key := c.currentKey()
		// event.Client.List calls the same CallRaw (stripe-go v82
		// event/client.go); the path and form are stripe-go's.
		err := c.backend.CallRaw(http.MethodGet, "/v1/events", key, []byte(body.Encode()), p, &list)
		if err == nil {
			if list.Object != "list" {
				return Page{}, fmt.Errorf("GET /v1/events answered an object %q, not a list", list.Object)
			}
			return Page{Events: list.Data, HasMore: list.HasMore}, nil
		}
		if ctx.Err() != nil {
			return Page{}, ctx.Err()
		}
		if info.Status == http.StatusUnauthorized && c.cfg.RefetchKey != nil && !refetched {
			refetched = true
			if c.refetchKey(ctx, key) {
				continue // the new key, at once
			}
		}
		retry, wait := c.retryable(err, info, attempt)
		if !retry || attempt >= c.cfg.MaxAttempts {
			return Page{}, fmt.Errorf("GET /v1/events (attempt %d of %d): %w", attempt, c.cfg.MaxAttempts, err)
		}
		c.cfg.Logger.Warn("events page failed, backing off", "attempt", attempt, "status", info.Status,
			"rate_limited_reason", info.RateLimitedReason, "retry_after", info.RetryAfter, "wait_ms", wait.Milliseconds(), "error", err.Error())
		if err := c.cfg.Sleep(ctx, wait); err != nil {
			return Page{}, err
		}
	}
}

func (c *Client) currentKey() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.key
}

// refetchKey fetches the key again after Stripe refused old (401) and
// reports whether it changed.
func (c *Client) refetchKey(ctx context.Context, old string) bool {
	key, err := c.cfg.RefetchKey(ctx)
	if err != nil {
		c.cfg.Logger.Error("Stripe refused the API key (401) and fetching it again failed", "error", err.Error())
		return false
	}
	if key == old {
		c.cfg.Logger.Error("Stripe refused the API key (401), and the key stored is the same: store a valid restricted key with Events: Read")
		return false
	}
	c.mu.Lock()
	c.key = key
	c.mu.Unlock()
	c.cfg.Logger.Warn("Stripe refused the API key (401); the key fetched again differs (rolled) and is used from now on")
	return true
}

// retryable says whether err is worth another attempt and how long to wait.
func (c *Client) retryable(err error, info *stripehttp.Answer, attempt int) (bool, time.Duration) {
	wait := c.backoff(attempt)
	var se *stripe.Error
	if errors.As(err, &se) {
		switch {
		case se.HTTPStatusCode == http.StatusTooManyRequests:
			// Stripe may say how long to wait; otherwise back off.
			if d, ok := info.RetryAfterDelay(); ok {
				wait = max(wait, d)
			}
			return true, wait
		case se.HTTPStatusCode >= 500:
			return true, wait
		default:
			return false, 0
		}
	}
	if info.Status >= 500 || info.Status == http.StatusTooManyRequests {
		return true, wait // an error body stripe-go could not decode
	}
	if info.Status != 0 && info.Status < 500 {
		return false, 0
	}
	return true, wait // no answer: a network error
}

func (c *Client) backoff(attempt int) time.Duration {
	d := c.cfg.BackoffBase << min(attempt-1, 20)
	if d <= 0 || d > c.cfg.BackoffCap {
		d = c.cfg.BackoffCap
	}
	return time.Duration(float64(d) * (0.5 + rand.Float64()/2))
}

// waitTurn spaces request starts by 1/Rate.
func (c *Client) waitTurn(ctx context.Context) error {
	interval := time.Duration(float64(time.Second) / c.cfg.Rate)
	c.mu.Lock()
	now := time.Now()
	start := now
	if c.next.After(now) {
		start = c.next
	}
	c.next = start.Add(interval)
	c.mu.Unlock()
	if d := start.Sub(now); d > 0 {
		return c.cfg.Sleep(ctx, d)
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
