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
)

// Fetcher returns the text of the secret that ref names.
type Fetcher func(ctx context.Context, ref string) (string, error)

// Literal is the Fetcher for local runs: the reference is the value.
func Literal(_ context.Context, ref string) (string, error) { return ref, nil }

// ErrUnknownEndpoint is returned for an endpoint the keyring does not hold.
var ErrUnknownEndpoint = errors.New("unknown webhook endpoint")

// Options tune a Keyring. Zero values take the defaults.
type Options struct {
	TTL        time.Duration    // default 5m: how long a fetched value is used
	MinRefresh time.Duration    // default 30s: least time between refreshes forced by a mismatch
	Now        func() time.Time // default time.Now
	Logger     *slog.Logger     // default slog.Default()
}

type entry struct {
	ref       string
	values    []string
	fetchedAt time.Time
}

// Keyring caches the signing secrets of every endpoint.
type Keyring struct {
	fetch Fetcher
	opts  Options

	mu      sync.Mutex
	entries map[string]*entry
}

// NewKeyring fetches every endpoint's secret once and returns an error naming
// the first endpoint whose secret cannot be fetched or parsed.
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
	for _, name := range names {
		e := &entry{ref: refs[name]}
		if err := k.load(ctx, name, e); err != nil {
			return nil, err
		}
		k.entries[name] = e
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
func (k *Keyring) Secrets(ctx context.Context, endpoint string) ([]string, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	e, ok := k.entries[endpoint]
	if !ok {
		return nil, ErrUnknownEndpoint
	}
	if k.opts.Now().Sub(e.fetchedAt) >= k.opts.TTL {
		if err := k.load(ctx, endpoint, e); err != nil {
			k.opts.Logger.ErrorContext(ctx, "signing secret refresh failed; using the cached value", "endpoint", endpoint, "error", err)
		}
	}
	return slices.Clone(e.values), nil
}

// RefreshAfterMismatch re-fetches endpoint's secrets when a signature matched
// none of them, unless they were fetched less than MinRefresh ago. It reports
// whether the values changed, that is whether verifying again can help.
func (k *Keyring) RefreshAfterMismatch(ctx context.Context, endpoint string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	e, ok := k.entries[endpoint]
	if !ok || k.opts.Now().Sub(e.fetchedAt) < k.opts.MinRefresh {
		return false
	}
	before := e.values
	if err := k.load(ctx, endpoint, e); err != nil {
		k.opts.Logger.ErrorContext(ctx, "signing secret refresh failed; using the cached value", "endpoint", endpoint, "error", err)
		return false
	}
	return !slices.Equal(before, e.values)
}

// load fetches and parses e. On error e is left unchanged except that the
// attempt time is recorded, so a failing Secrets Manager is not called on
// every request.
func (k *Keyring) load(ctx context.Context, endpoint string, e *entry) error {
	text, err := k.fetch(ctx, e.ref)
	if err != nil {
		if e.values != nil {
			e.fetchedAt = k.opts.Now()
		}
		return fmt.Errorf("fetching the signing secret of endpoint %q: %w", endpoint, err)
	}
	values, err := Parse(text)
	if err != nil {
		if e.values != nil {
			e.fetchedAt = k.opts.Now()
		}
		return fmt.Errorf("signing secret of endpoint %q: %w", endpoint, err)
	}
	e.values = values
	e.fetchedAt = k.opts.Now()
	return nil
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
