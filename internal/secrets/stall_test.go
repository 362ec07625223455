package secrets_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/metrics"
	"github.com/stripe-inbox/inbox/internal/secrets"
)

// stallingStore is a Secrets Manager stand-in whose fetches of a stalled
// reference block until the test releases them or their context ends. It
// records how each blocked fetch ended.
type stallingStore struct {
	mu        sync.Mutex
	values    map[string]string
	stalled   map[string]chan struct{} // closed to release
	calls     map[string]int
	abandoned []error // context.Cause of each fetch given up by its context
	entered   chan string
}

func newStallingStore(values map[string]string) *stallingStore {
	return &stallingStore{values: values, stalled: map[string]chan struct{}{}, calls: map[string]int{}, entered: make(chan string, 100)}
}

func (s *stallingStore) stall(ref string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stalled[ref] = make(chan struct{})
}

func (s *stallingStore) release(ref string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.stalled[ref])
	delete(s.stalled, ref)
}

func (s *stallingStore) fetch(ctx context.Context, ref string) (string, error) {
	s.mu.Lock()
	s.calls[ref]++
	release, stalled := s.stalled[ref]
	s.mu.Unlock()
	if stalled {
		s.entered <- ref
		select {
		case <-release:
		case <-ctx.Done():
			s.mu.Lock()
			s.abandoned = append(s.abandoned, context.Cause(ctx))
			s.mu.Unlock()
			return "", ctx.Err()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.values[ref], nil
}

func (s *stallingStore) state() (calls map[string]int, abandoned []error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := map[string]int{}
	for k, v := range s.calls {
		c[k] = v
	}
	return c, append([]error(nil), s.abandoned...)
}

// errRequestBudget ends a test's "request" context: a fetch abandoned with
// this cause ran on the request's budget instead of its own timeout.
var errRequestBudget = errors.New("the request's whole budget was used up")

// requestContext stands for a delivery's context: its deadline is far away
// (the function's timeout), and a fetch must never need it.
func requestContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeoutCause(context.Background(), 20*time.Second, errRequestBudget)
	t.Cleanup(cancel)
	return ctx
}

type testBundle struct {
	store   *stallingStore
	clock   *clock
	logs    *bytes.Buffer
	metrics *bytes.Buffer
	mu      sync.Mutex // guards logs and metrics
}

func (b *testBundle) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.logs.Write(p)
}

func (b *testBundle) output() (logs, metrics string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.logs.String(), b.metrics.String()
}

type metricsWriter struct{ b *testBundle }

func (w metricsWriter) Write(p []byte) (int, error) {
	w.b.mu.Lock()
	defer w.b.mu.Unlock()
	return w.b.metrics.Write(p)
}

func newKeyringBundle(values map[string]string) *testBundle {
	return &testBundle{store: newStallingStore(values), clock: &clock{now: time.Unix(1000, 0)}, logs: &bytes.Buffer{}, metrics: &bytes.Buffer{}}
}

func (b *testBundle) options(fetchTimeout time.Duration) secrets.Options {
	return secrets.Options{
		TTL: time.Minute, FetchTimeout: fetchTimeout, Now: b.clock.Now,
		Logger:  slog.New(slog.NewJSONHandler(b, nil)),
		Metrics: metrics.New(metricsWriter{b}, "Test", map[string]string{"Service": "webhook"}),
	}
}

// TestStalledRefreshIsAbandonedAndTheCacheServed: when Secrets Manager hangs
// on a refresh, the fetch is abandoned by its own timeout (not the request's
// budget), the request gets the cached secrets, the failure is logged and
// counted, and the next requests within the TTL do not try again.
func TestStalledRefreshIsAbandonedAndTheCacheServed(t *testing.T) {
	t.Parallel()
	b := newKeyringBundle(map[string]string{"arn:b": "whsec_one"})
	k, err := secrets.NewKeyring(requestContext(t), map[string]string{"billing": "arn:b"}, b.store.fetch, b.options(50*time.Millisecond))
	require.NoError(t, err)

	b.store.stall("arn:b")
	b.clock.now = b.clock.now.Add(time.Minute) // the TTL has passed
	ctx := requestContext(t)
	got, err := k.Secrets(ctx, "billing")
	require.NoError(t, err)
	require.Equal(t, []string{"whsec_one"}, got, "the cached secret is served")
	require.NoError(t, ctx.Err(), "the request's budget is intact")

	calls, abandoned := b.store.state()
	require.Equal(t, 2, calls["arn:b"])
	require.Len(t, abandoned, 1)
	require.ErrorIs(t, abandoned[0], context.DeadlineExceeded, "abandoned by the fetch's own timeout, not the request's budget")
	logs, ems := b.output()
	require.Contains(t, logs, "signing secret refresh failed; using the cached value")
	require.Contains(t, ems, `"SecretRefreshFailed":1`)

	for range 5 {
		got, err = k.Secrets(requestContext(t), "billing")
		require.NoError(t, err)
		require.Equal(t, []string{"whsec_one"}, got)
	}
	calls, _ = b.store.state()
	require.Equal(t, 2, calls["arn:b"], "a failed refresh is not retried within the TTL")
}

// TestOneRefreshInFlightOthersServeTheCache: while one request's refresh is
// stalled, every other request serves the cached secrets at once and starts
// no fetch of its own; when the stand-in is released, the refresh completes
// and its value is served.
func TestOneRefreshInFlightOthersServeTheCache(t *testing.T) {
	t.Parallel()
	b := newKeyringBundle(map[string]string{"arn:b": "whsec_one"})
	k, err := secrets.NewKeyring(requestContext(t), map[string]string{"billing": "arn:b"}, b.store.fetch, b.options(time.Minute))
	require.NoError(t, err)

	b.store.stall("arn:b")
	b.store.mu.Lock()
	b.store.values["arn:b"] = "whsec_two,whsec_one"
	b.store.mu.Unlock()
	b.clock.now = b.clock.now.Add(time.Minute)

	leader := make(chan []string)
	go func() {
		got, _ := k.Secrets(requestContext(t), "billing")
		leader <- got
	}()
	require.Equal(t, "arn:b", <-b.store.entered, "the leader's fetch is stalled")

	others := make(chan error)
	go func() {
		for range 50 {
			got, err := k.Secrets(requestContext(t), "billing")
			if err == nil && len(got) != 1 {
				err = errors.New("not the cached value")
			}
			if err != nil {
				others <- err
				return
			}
		}
		others <- nil
	}()
	select {
	case err := <-others:
		require.NoError(t, err)
	case got := <-leader:
		t.Fatalf("the stalled refresh returned %v before it was released", got)
	}
	calls, _ := b.store.state()
	require.Equal(t, 2, calls["arn:b"], "one fetch in flight, however many requests")

	b.store.release("arn:b")
	require.Equal(t, []string{"whsec_two", "whsec_one"}, <-leader)
	got, err := k.Secrets(requestContext(t), "billing")
	require.NoError(t, err)
	require.Equal(t, []string{"whsec_two", "whsec_one"}, got)
	calls, abandoned := b.store.state()
	require.Equal(t, 2, calls["arn:b"])
	require.Empty(t, abandoned)
}

// TestStalledFirstFetchAtStart: a fetch at start abandoned by its timeout
// does not fail the start, and does not hold up the other endpoints; the
// endpoint answers ErrUnavailable (the webhook's 5xx) after one bounded
// fetch per request, and is served once Secrets Manager answers again. A
// secret that is missing or malformed still fails the start.
func TestStalledFirstFetchAtStart(t *testing.T) {
	t.Parallel()
	b := newKeyringBundle(map[string]string{"arn:b": "whsec_one", "arn:c": "whsec_connect"})
	b.store.stall("arn:b")
	refs := map[string]string{"billing": "arn:b", "connect": "arn:c"}
	k, err := secrets.NewKeyring(requestContext(t), refs, b.store.fetch, b.options(50*time.Millisecond))
	require.NoError(t, err, "a stalled Secrets Manager is not a configuration mistake")
	logs, ems := b.output()
	require.Contains(t, logs, "signing secret not fetched at start")
	require.Contains(t, ems, `"SecretRefreshFailed":1`)

	got, err := k.Secrets(requestContext(t), "connect")
	require.NoError(t, err)
	require.Equal(t, []string{"whsec_connect"}, got)

	ctx := requestContext(t)
	_, err = k.Secrets(ctx, "billing")
	require.ErrorIs(t, err, secrets.ErrUnavailable)
	require.NoError(t, ctx.Err(), "the request's budget is intact")
	calls, abandoned := b.store.state()
	require.Equal(t, 2, calls["arn:b"], "the start's fetch and the request's")
	require.Len(t, abandoned, 2)
	for _, cause := range abandoned {
		require.ErrorIs(t, cause, context.DeadlineExceeded)
	}

	b.store.release("arn:b")
	got, err = k.Secrets(requestContext(t), "billing")
	require.NoError(t, err)
	require.Equal(t, []string{"whsec_one"}, got)

	// A configuration mistake still fails the start.
	b2 := newKeyringBundle(map[string]string{"arn:b": "not-a-secret"})
	_, err = secrets.NewKeyring(requestContext(t), map[string]string{"billing": "arn:b"}, b2.store.fetch, b2.options(50*time.Millisecond))
	require.ErrorContains(t, err, "not a Stripe signing secret")
}
