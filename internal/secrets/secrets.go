// Package secrets holds each webhook endpoint's Stripe signing secrets.
//
// A Keyring maps endpoint names to a reference (a Secrets Manager ARN in AWS,
// the literal value locally) and a Fetcher that turns the reference into the
// secret text. Every endpoint is fetched once when the keyring is built, so a
// missing or malformed secret fails the function's init with a message that
// says what to fix. After that a value is re-fetched when it is older than the
// TTL, so a rotation is picked up without a deploy; and when a signature
// matches none of the cached secrets, the endpoint is re-fetched at most once
// per MinRefresh, so the first event signed with a brand-new secret does not
// have to wait for the TTL.
//
// A fetch never runs on a request's whole budget: each has its own
// FetchTimeout, so a Secrets Manager that hangs cannot eat the function's
// timeout. A refresh that fails or is abandoned keeps the cached values
// (logged, and counted in the SecretRefreshFailed metric). One fetch per
// endpoint is in flight at a time: the request that starts it waits for it
// (at most FetchTimeout), and every other request meanwhile serves the cached
// values without waiting. An endpoint whose first fetch, at start, was
// abandoned by its timeout has no cached values: the start goes on (other
// endpoints may be fine, and a config mistake still fails the start), and
// each delivery to it tries one bounded fetch and, failing that, gets
// ErrUnavailable, which the webhook answers with a 5xx so that Stripe retries.
//
// A secret's text holds one or more signing secrets (whsec_...) separated by
// commas or white space: two during a roll, the new and the old.
package secrets

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/stripe-inbox/inbox/internal/metrics"
)

// Fetcher returns the text of the secret that ref names. It must give up
// when ctx is done.
type Fetcher func(ctx context.Context, ref string) (string, error)

// Literal is the Fetcher for local runs: the reference is the value.
func Literal(_ context.Context, ref string) (string, error) { return ref, nil }

var (
	// ErrUnknownEndpoint is returned for an endpoint the keyring does not hold.
	ErrUnknownEndpoint = errors.New("unknown webhook endpoint")
	// ErrUnavailable is returned for an endpoint whose secrets have never
	// been fetched (its fetches failed since the start); a retry may succeed.
	ErrUnavailable = errors.New("signing secret not available yet")
)

// DefaultFetchTimeout bounds each fetch. Secrets Manager answers in tens of
// milliseconds; the webhook's function timeout is 10s and its STORE_TIMEOUT
// 5s, so a hanging fetch and a slow commit still answer before the timeout.
const DefaultFetchTimeout = 2 * time.Second

// Options tune a Keyring. Zero values take the defaults.
type Options struct {
	TTL          time.Duration    // default 5m: how long a fetched value is used
	MinRefresh   time.Duration    // default 30s: least time between refreshes forced by a mismatch
	FetchTimeout time.Duration    // default DefaultFetchTimeout: bounds each fetch, whatever the caller's deadline
	Now          func() time.Time // default time.Now
	Logger       *slog.Logger     // default slog.Default()
	Metrics      *metrics.Emitter // may be nil: SecretRefreshFailed is then only logged
}

type entry struct {
	ref       string
	values    []string  // nil until a fetch has succeeded
	fetchedAt time.Time // last completed attempt (success or failure)
	flight    *flight   // the fetch in flight, if any
}

// flight is one fetch of an entry; done is closed when it has completed and
// err and changed are set.
type flight struct {
	done    chan struct{}
	err     error
	changed bool
}

// Keyring caches the signing secrets of every endpoint.
type Keyring struct {
	fetch Fetcher
	opts  Options

	mu      sync.Mutex
	entries map[string]*entry
}

// NewKeyring fetches every endpoint's secret once (concurrently, each within
// FetchTimeout) and returns an error naming the first endpoint whose secret
// cannot be fetched or parsed. A fetch abandoned by its timeout is not an
// error: that endpoint starts without cached values (see ErrUnavailable).
func NewKeyring(ctx context.Context, refs map[string]string, fetch Fetcher, opts Options) (*Keyring, error) {
	if len(refs) == 0 {
		return nil, errors.New("no webhook endpoints configured")
	}
	if opts.TTL <= 0 {
		opts.TTL = 5 * time.Minute
	}
	if opts.MinRefresh <= 0 {
		opts.MinRefresh = 30 * time.Second
	}
	if opts.FetchTimeout <= 0 {
		opts.FetchTimeout = DefaultFetchTimeout
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	k := &Keyring{fetch: fetch, opts: opts, entries: map[string]*entry{}}
	names := make([]string, 0, len(refs))
	for name := range refs {
		names = append(names, name)
	}
	slices.Sort(names)
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		e := &entry{ref: refs[name]}
		k.entries[name] = e
		wg.Go(func() {
			values, err, abandoned := k.load(ctx, name, e.ref)
			switch {
			case err == nil:
				e.values, e.fetchedAt = values, k.opts.Now()
			case abandoned && ctx.Err() == nil:
				k.opts.Logger.ErrorContext(ctx, "signing secret not fetched at start; deliveries to this endpoint answer 5xx until a fetch succeeds",
					"endpoint", name, "error", err)
				k.emitFailed(ctx)
			default:
				errs[i] = err
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return k, nil
}

// Endpoints lists the endpoint names, sorted.
func (k *Keyring) Endpoints() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	names := make([]string, 0, len(k.entries))
	for name := range k.entries {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// Secrets returns endpoint's signing secrets, re-fetching them first when they
// are older than the TTL. A failed re-fetch keeps the previous values (and is
// logged): a Secrets Manager hiccup must not turn every delivery into a 5xx.
// While another request's fetch is in flight, the cached values are returned
// at once. An endpoint without cached values waits for a fetch (its own or
// the one in flight) and returns ErrUnavailable when it fails.
func (k *Keyring) Secrets(ctx context.Context, endpoint string) ([]string, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	e, ok := k.entries[endpoint]
	if !ok {
		return nil, ErrUnknownEndpoint
	}
	switch {
	case e.values == nil:
		f, done := k.refresh(ctx, endpoint, e, true)
		if e.values == nil {
			if done && f.err != nil {
				return nil, fmt.Errorf("%w: %w", ErrUnavailable, f.err)
			}
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, context.Cause(ctx))
		}
	case k.opts.Now().Sub(e.fetchedAt) >= k.opts.TTL:
		k.refresh(ctx, endpoint, e, false)
	}
	return slices.Clone(e.values), nil
}

// RefreshAfterMismatch re-fetches endpoint's secrets when a signature matched
// none of them, unless they were fetched less than MinRefresh ago. It reports
// whether the values changed, that is whether verifying again can help. When
// a fetch is already in flight it waits for that one.
func (k *Keyring) RefreshAfterMismatch(ctx context.Context, endpoint string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	e, ok := k.entries[endpoint]
	if !ok || (e.flight == nil && k.opts.Now().Sub(e.fetchedAt) < k.opts.MinRefresh) {
		return false
	}
	f, done := k.refresh(ctx, endpoint, e, true)
	return done && f.changed
}

// refresh starts e's fetch and waits for it, or, when one is already in
// flight, waits for that one if wait is set and returns at once otherwise.
// It reports whether the flight has completed. It is called with k.mu held
// and returns with it held; the lock is released while waiting.
func (k *Keyring) refresh(ctx context.Context, endpoint string, e *entry, wait bool) (*flight, bool) {
	if f := e.flight; f != nil {
		if !wait {
			return f, false
		}
		k.mu.Unlock()
		defer k.mu.Lock()
		select {
		case <-f.done:
			return f, true
		case <-ctx.Done():
			return f, false
		}
	}
	f := &flight{done: make(chan struct{})}
	e.flight = f
	k.mu.Unlock()
	values, err, abandoned := k.load(ctx, endpoint, e.ref)
	k.mu.Lock()
	e.flight = nil
	f.err = err
	switch {
	case err == nil:
		f.changed = !slices.Equal(e.values, values)
		e.values, e.fetchedAt = values, k.opts.Now()
	case abandoned && ctx.Err() != nil:
		// The caller gave up (its request ended), not Secrets Manager:
		// the next request tries again.
	default:
		// Recorded as an attempt, so a failing Secrets Manager is not
		// called on every request while there are values to serve.
		e.fetchedAt = k.opts.Now()
	}
	close(f.done)
	if err != nil {
		if e.values != nil {
			k.opts.Logger.ErrorContext(ctx, "signing secret refresh failed; using the cached value", "endpoint", endpoint, "error", err)
		} else {
			k.opts.Logger.ErrorContext(ctx, "signing secret unavailable; the delivery answers 5xx", "endpoint", endpoint, "error", err)
		}
		k.emitFailed(ctx)
	}
	return f, true
}

// load fetches and parses ref within FetchTimeout. abandoned reports that
// the fetch did not complete because its context ended (its own timeout or
// ctx), rather than failing.
func (k *Keyring) load(ctx context.Context, endpoint, ref string) (values []string, err error, abandoned bool) {
	fetchCtx, cancel := context.WithTimeout(ctx, k.opts.FetchTimeout)
	defer cancel()
	text, err := k.fetch(fetchCtx, ref)
	if err != nil {
		if fetchCtx.Err() != nil {
			return nil, fmt.Errorf("fetching the signing secret of endpoint %q: abandoned after %s: %w", endpoint, k.opts.FetchTimeout, err), true
		}
		return nil, fmt.Errorf("fetching the signing secret of endpoint %q: %w", endpoint, err), false
	}
	values, err = Parse(text)
	if err != nil {
		return nil, fmt.Errorf("signing secret of endpoint %q: %w", endpoint, err), false
	}
	return values, nil, false
}

func (k *Keyring) emitFailed(ctx context.Context) {
	if err := k.opts.Metrics.Emit(nil, metrics.Metric{Name: "SecretRefreshFailed", Value: 1, Unit: metrics.Count}); err != nil {
		k.opts.Logger.ErrorContext(ctx, "writing metrics", "error", err)
	}
}

// Parse splits a secret's text into signing secrets and checks their shape.
func Parse(text string) ([]string, error) {
	fields := strings.FieldsFunc(text, func(r rune) bool {
		return r == ',' || r == ' ' || r == '\n' || r == '\r' || r == '\t'
	})
	if len(fields) == 0 {
		return nil, errors.New("it is empty: put the endpoint's signing secret (whsec_...) into it, or two separated by a comma during a roll")
	}
	for _, f := range fields {
		if !strings.HasPrefix(f, "whsec_") || len(f) <= len("whsec_") {
			return nil, errors.New("it holds a value that is not a Stripe signing secret: each value must start with whsec_ (copy it from the endpoint's page in the Stripe dashboard)")
		}
	}
	return fields, nil
}
