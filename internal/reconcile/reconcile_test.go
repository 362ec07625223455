package reconcile_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/metrics"
	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/reconcile"
	"github.com/stripe-inbox/inbox/internal/reconcile/fakeapi"
	"github.com/stripe-inbox/inbox/internal/stripeevent"
	"github.com/stripe-inbox/inbox/internal/stripetest"
)

var now = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)

func handlerTypes() []string {
	var ts []string
	for t := range handlers.Default() {
		ts = append(ts, t)
	}
	return ts
}

type testBundle struct {
	db      *pgtest.Database
	api     *fakeapi.Server
	sleeps  []time.Duration
	mu      sync.Mutex
	metrics *bytes.Buffer
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	b := &testBundle{db: pgtest.DB(t), api: fakeapi.New(""), metrics: &bytes.Buffer{}}
	t.Cleanup(b.api.Close)
	return b
}

func (b *testBundle) client(t *testing.T, maxAttempts int) *reconcile.Client {
	t.Helper()
	c, err := reconcile.NewClient(reconcile.ClientConfig{
		Key: fakeapi.Key, BaseURL: b.api.URL, Rate: 1000, MaxAttempts: maxAttempts,
		// The delays are recorded, not waited: what is asserted is what the
		// client chose to wait, never how long anything took.
		Sleep: func(_ context.Context, d time.Duration) error {
			b.mu.Lock()
			defer b.mu.Unlock()
			if d >= 100*time.Millisecond { // rate spacing at 1000/s is below this
				b.sleeps = append(b.sleeps, d)
			}
			return nil
		},
	})
	require.NoError(t, err)
	return c
}

func (b *testBundle) reconciler(t *testing.T, cfg reconcile.Config, maxAttempts int) *reconcile.Reconciler {
	t.Helper()
	cfg.Endpoint = "billing"
	if cfg.Types == nil {
		cfg.Types = handlerTypes()
	}
	cfg = cfg.WithDefaults()
	require.NoError(t, cfg.Validate())
	r, err := reconcile.New(reconcile.DBSink{DB: b.db.Pool}, b.client(t, maxAttempts), cfg, nil, metrics.New(b.metrics, "Test", map[string]string{"Service": "reconcile"}))
	require.NoError(t, err)
	r.Now = func() time.Time { return now }
	return r
}

// event returns an invoice.paid (or typ) event created ago before now.
func event(id, typ string, ago time.Duration) []byte {
	return stripetest.EventWith(id, typ, stripetest.Meta{Created: now.Add(-ago).Unix()}, stripetest.Invoice("in_"+id, "cus_1", "paid", 100))
}

// deliver stores raw as the webhook does.
func (b *testBundle) deliver(t *testing.T, raw []byte) {
	t.Helper()
	ev, err := stripeevent.Parse(raw)
	require.NoError(t, err)
	_, err = inbox.Store(context.Background(), b.db.Pool, "billing", ev)
	require.NoError(t, err)
}

func (b *testBundle) highWater(t *testing.T) (time.Time, bool) {
	t.Helper()
	hw, ok, err := inbox.HighWater(context.Background(), b.db.Pool, "billing")
	require.NoError(t, err)
	return hw, ok
}

// A gap in the middle of a window (the webhook was down for an hour) is
// filled: the missing events are stored with source 'reconcile' and counted
// by type; what the webhook stored is already present.
func TestGapInTheMiddleIsFilled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 30 {
		typ := "invoice.paid"
		if i%3 == 0 {
			typ = "invoice.finalized"
		}
		raw := event(fmt.Sprintf("evt_%02d", i), typ, time.Duration(30-i)*10*time.Minute)
		b.api.Add(raw)
		if i < 10 || i >= 20 {
			b.deliver(t, raw)
		}
	}
	// An event of a type no handler reads is not listed.
	b.api.Add(event("evt_other", "customer.created", time.Hour))

	s, err := b.reconciler(t, reconcile.Config{}, 3).Run(context.Background())
	require.NoError(t, err)
	require.True(t, s.Complete)
	require.Equal(t, 10, s.Stored)
	require.Equal(t, 20, s.AlreadyPresent)
	require.Equal(t, map[string]int{"invoice.paid": 7, "invoice.finalized": 3}, s.MissingByType)
	require.Equal(t, 10, b.db.Count(t, "webhook_inbox", "source = 'reconcile' AND event_id BETWEEN 'evt_10' AND 'evt_19'"))
	require.Equal(t, 20, b.db.Count(t, "webhook_inbox", "source = 'webhook'"))
	require.Equal(t, 0, b.db.Count(t, "webhook_inbox", "event_id = 'evt_other'"))
	require.Equal(t, 10, b.db.Count(t, "webhook_inbox", "source = 'reconcile' AND api_version = $1 AND processed_at IS NULL", stripetest.APIVersion))
	hw, ok := b.highWater(t)
	require.True(t, ok)
	require.Equal(t, now.Add(-reconcile.DefaultSettle), hw.UTC())

	out := b.metrics.String()
	require.Contains(t, out, `"EventsFoundMissing":10`)
	require.Contains(t, out, `"EventType":"invoice.paid"`)
	require.Contains(t, out, `"EventsFoundMissing":7`)
	require.Contains(t, out, `"ReconcileAlreadyPresent":20`)
}

// A window of several pages is stored completely: every page is read,
// newest first, each after the last event of the previous one, whatever the
// page size.
func TestSeveralPagesAreStoredCompletely(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 250 {
		b.api.Add(event(fmt.Sprintf("evt_%03d", i), "refund.updated", time.Duration(250-i)*time.Minute/4+2*time.Minute))
	}
	// Several events in one second: the cursor is the event, not the time.
	for i := range 7 {
		b.api.Add(event(fmt.Sprintf("evt_same_%d", i), "refund.updated", 30*time.Minute))
	}
	r := b.reconciler(t, reconcile.Config{PageLimit: 25, Slice: reconcile.DefaultLookback}, 3)
	s, err := r.Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, 257, s.Stored)
	require.Equal(t, 257, s.Events)
	require.Equal(t, 257, b.db.Count(t, "webhook_inbox", "source = 'reconcile'"))
	require.Equal(t, 11, s.Pages, "⌈257/25⌉ pages")

	reqs := b.api.Requests()
	require.Len(t, reqs, 11)
	require.Empty(t, reqs[0].Get("starting_after"))
	for _, q := range reqs[1:] {
		require.NotEmpty(t, q.Get("starting_after"))
	}
	require.Equal(t, "25", reqs[0].Get("limit"))
	require.Equal(t, fmt.Sprint(now.Add(-reconcile.DefaultLookback).Unix()), reqs[0].Get("created[gte]"))
}

// Running twice stores nothing new, and the second run re-lists only the
// overlap before the mark.
func TestRunningTwiceStoresNothingNew(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 40 {
		b.api.Add(event(fmt.Sprintf("evt_%02d", i), "invoice.paid", time.Duration(40-i)*time.Minute+2*time.Minute))
	}
	r := b.reconciler(t, reconcile.Config{PageLimit: 10}, 3)
	s, err := r.Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, 40, s.Stored)

	s, err = r.Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, 0, s.Stored)
	require.Equal(t, 9, s.AlreadyPresent, "the events of the 10 minutes before the mark (the overlap), 3 to 11 minutes old")
	require.Equal(t, 40, b.db.Count(t, "webhook_inbox", ""))

	// A backfill of the whole window, twice: nothing new either time.
	for range 2 {
		s, err = r.Backfill(context.Background(), now.Add(-2*time.Hour), now, []string{"invoice.paid"})
		require.NoError(t, err)
		require.Equal(t, 0, s.Stored)
		require.Equal(t, 40, s.AlreadyPresent)
	}
}

// The high-water mark does not advance past a slice whose page failed: the
// slices before it are kept, and the next run lists the failed slice again
// and completes it.
func TestHighWaterStaysBeforeAFailedPage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Three slices of an hour (the lookback); two pages each.
	for i := range 36 {
		b.api.Add(event(fmt.Sprintf("evt_%02d", i), "invoice.paid", time.Duration(36-i)*5*time.Minute-time.Second))
	}
	cfg := reconcile.Config{Lookback: 3 * time.Hour, Slice: time.Hour, PageLimit: 7, Settle: time.Nanosecond}
	// The slices' requests: 1 and 2 (first hour), 3 and 4: the second
	// page of the second hour fails for good (one attempt).
	b.api.FailRequest(4, fakeapi.Failure{Status: http.StatusServiceUnavailable})
	s, err := b.reconciler(t, cfg, 1).Run(context.Background())
	require.ErrorContains(t, err, "attempt 1 of 1")
	require.False(t, s.Complete)
	hw, ok := b.highWater(t)
	require.True(t, ok)
	require.Equal(t, now.Add(-2*time.Hour), hw.UTC(), "the first hour's end, not further")
	stored := b.db.Count(t, "webhook_inbox", "")
	require.Equal(t, 12+7, stored, "the first slice and the failed slice's first page")

	s, err = b.reconciler(t, cfg, 1).Run(context.Background())
	require.NoError(t, err)
	require.True(t, s.Complete)
	require.Equal(t, 36-stored, s.Stored)
	require.Equal(t, 36, b.db.Count(t, "webhook_inbox", ""))
	hw, _ = b.highWater(t)
	require.Equal(t, now.Add(-time.Second), hw.UTC(), "now − settle, in whole seconds")
}

// A 429 backs off (at least Retry-After when Stripe sends it) and the run
// finishes; 5xx too. A 401 (a wrong key) fails at once.
func TestRateLimitBacksOffAndFinishes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 15 {
		b.api.Add(event(fmt.Sprintf("evt_%02d", i), "invoice.paid", time.Duration(i+2)*time.Minute))
	}
	b.api.FailNext(
		fakeapi.Failure{Status: http.StatusTooManyRequests, Headers: map[string]string{"Retry-After": "7", "Stripe-Rate-Limited-Reason": "global-rate"}},
		fakeapi.Failure{Status: http.StatusTooManyRequests},
		fakeapi.Failure{Status: http.StatusInternalServerError},
	)
	s, err := b.reconciler(t, reconcile.Config{PageLimit: 10, Slice: reconcile.DefaultLookback}, 5).Run(context.Background())
	require.NoError(t, err)
	require.True(t, s.Complete)
	require.Equal(t, 15, s.Stored)
	require.Len(t, b.api.Requests(), 3+2)
	require.Len(t, b.sleeps, 3)
	require.GreaterOrEqual(t, b.sleeps[0], 7*time.Second, "Retry-After honoured")
	require.Less(t, b.sleeps[1], 7*time.Second, "no Retry-After: the backoff")

	bad, err := reconcile.NewClient(reconcile.ClientConfig{Key: "rk_test_wrong", BaseURL: b.api.URL, MaxAttempts: 5})
	require.NoError(t, err)
	_, err = bad.ListPage(context.Background(), reconcile.Query{Types: []string{"invoice.paid"}, Since: now.Add(-time.Hour), Until: now})
	require.ErrorContains(t, err, "attempt 1 of 5")
	require.ErrorContains(t, err, "Invalid API Key")
}

// More than 20 types are listed in groups of at most 20 (Stripe's limit on
// types[]); each group pages on its own.
func TestMoreThanTwentyTypesAreListedInGroups(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var types []string
	for i := range 25 {
		typ := fmt.Sprintf("thing.t%02d", i)
		types = append(types, typ)
		b.api.Add(event(fmt.Sprintf("evt_%02d", i), typ, time.Duration(i+2)*time.Minute))
	}
	s, err := b.reconciler(t, reconcile.Config{Types: types, Slice: reconcile.DefaultLookback}, 1).Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, 25, s.Stored)
	reqs := b.api.Requests()
	require.Len(t, reqs, 2)
	n := 0
	for _, q := range reqs {
		k := 0
		for key := range q {
			if strings.HasPrefix(key, "types[") {
				k++
			}
		}
		require.LessOrEqual(t, k, 20)
		n += k
	}
	require.Equal(t, 25, n)
}

// A mark older than Stripe's 30 days (the reconciler was off for longer) is
// clamped at the horizon and says so.
func TestWindowIsClampedAtTheHorizon(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := inbox.AdvanceHighWater(context.Background(), b.db.Pool, "billing", now.Add(-40*24*time.Hour))
	require.NoError(t, err)
	b.api.Add(event("evt_1", "invoice.paid", 29*24*time.Hour))
	s, err := b.reconciler(t, reconcile.Config{Slice: 30 * 24 * time.Hour}, 1).Run(context.Background())
	require.NoError(t, err)
	require.True(t, s.Clamped)
	require.Equal(t, 1, s.Stored)
	require.Equal(t, fmt.Sprint(now.Add(-reconcile.Horizon+time.Minute).Unix()), b.api.Requests()[0].Get("created[gte]"))
}

// Configuration mistakes are refused with what to fix.
func TestConfigValidate(t *testing.T) {
	t.Parallel()
	err := reconcile.Config{Endpoint: "billing", Types: []string{"a"}, Settle: 10 * time.Minute, Lookback: 31 * 24 * time.Hour}.WithDefaults().Validate()
	require.ErrorContains(t, err, "RECONCILE_SETTLE=10m0s: must be from 0 to 5m0s")
	require.ErrorContains(t, err, "RECONCILE_LOOKBACK=744h0m0s")
}
