package reconcile_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/database"
	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/metrics"
	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/reconcile"
	"github.com/stripe-inbox/inbox/internal/reconcile/fakeapi"
	"github.com/stripe-inbox/inbox/internal/stripeevent"
	"github.com/stripe-inbox/inbox/internal/stripetest"
	"github.com/stripe-inbox/inbox/internal/worker"
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
	sink    *recordingSink
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	b := &testBundle{db: pgtest.DB(t), api: fakeapi.New(""), metrics: &bytes.Buffer{}}
	b.sink = &recordingSink{Sink: reconcile.DBSink{DB: b.db.Pool}}
	t.Cleanup(b.api.Close)
	return b
}

// recordingSink records every mark the reconciler moves to.
type recordingSink struct {
	reconcile.Sink
	mu       sync.Mutex
	advances []time.Time
}

func (s *recordingSink) Advance(ctx context.Context, endpoint string, to time.Time) error {
	s.mu.Lock()
	s.advances = append(s.advances, to)
	s.mu.Unlock()
	return s.Sink.Advance(ctx, endpoint, to)
}

func (s *recordingSink) marks() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.advances...)
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

func (b *testBundle) reconcilerWith(t *testing.T, lister reconcile.Lister, cfg reconcile.Config) *reconcile.Reconciler {
	t.Helper()
	cfg.Endpoint = "billing"
	if cfg.Types == nil {
		cfg.Types = handlerTypes()
	}
	cfg = cfg.WithDefaults()
	require.NoError(t, cfg.Validate())
	r, err := reconcile.New(b.sink, lister, cfg, nil, metrics.New(b.metrics, "Test", map[string]string{"Service": "reconcile"}))
	require.NoError(t, err)
	r.Now = func() time.Time { return now }
	return r
}

func (b *testBundle) reconciler(t *testing.T, cfg reconcile.Config, maxAttempts int) *reconcile.Reconciler {
	t.Helper()
	return b.reconcilerWith(t, b.client(t, maxAttempts), cfg)
}

// event returns an invoice.paid (or typ) event created ago before now.
func event(id, typ string, ago time.Duration) []byte {
	return stripetest.EventWith(id, typ, stripetest.Meta{Created: now.Add(-ago).Unix()}, stripetest.Invoice("in_"+id, "cus_1", "paid", 100))
}

// deliver stores raw as the webhook does.
func (b *testBundle) deliver(t *testing.T, raw []byte) inbox.StoreOutcome {
	t.Helper()
	ev, err := stripeevent.Verify(raw, stripetest.Sign(raw, time.Now(), "whsec_test"), []string{"whsec_test"})
	require.NoError(t, err)
	out, err := inbox.Store(context.Background(), b.db.Pool, "billing", ev)
	require.NoError(t, err)
	return out
}

func (b *testBundle) highWater(t *testing.T) (time.Time, bool) {
	t.Helper()
	hw, ok, err := inbox.HighWater(context.Background(), b.db.Pool, "billing")
	require.NoError(t, err)
	return hw, ok
}

// requireIncreasing checks that the marks only move forward.
func requireIncreasing(t *testing.T, marks []time.Time) {
	t.Helper()
	for i := 1; i < len(marks); i++ {
		require.True(t, marks[i].After(marks[i-1]), "mark %d (%s) after %s", i, marks[i], marks[i-1])
	}
}

// A gap in the middle of a window (the webhook was down for an hour and a
// half) is filled: the missing events are stored with source 'reconcile'
// and counted by type; what the webhook stored is already present.
func TestGapInTheMiddleIsFilled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 30 {
		typ := "invoice.paid"
		if i%3 == 0 {
			typ = "invoice.finalized"
		}
		raw := event(fmt.Sprintf("evt_%02d", i), typ, time.Duration(30-i)*10*time.Minute+reconcile.DefaultSettle)
		b.api.Add(raw)
		if i < 10 || i >= 20 {
			b.deliver(t, raw)
		}
	}
	// An event of a type no handler reads is not listed; one younger than
	// the settle window is not listed yet (Stripe may still deliver it).
	b.api.Add(event("evt_other", "customer.created", 2*time.Hour))
	b.api.Add(event("evt_young", "invoice.paid", reconcile.DefaultSettle-time.Minute))

	s, err := b.reconciler(t, reconcile.Config{}, 3).Run(context.Background())
	require.NoError(t, err)
	require.True(t, s.Complete)
	require.Equal(t, 10, s.Stored)
	require.Equal(t, 20, s.AlreadyPresent)
	require.Equal(t, map[string]int{"invoice.paid": 7, "invoice.finalized": 3}, s.MissingByType)
	require.Equal(t, 10, b.db.Count(t, "webhook_inbox", "source = 'reconcile' AND listed_first AND event_id BETWEEN 'evt_10' AND 'evt_19'"))
	require.Equal(t, 20, b.db.Count(t, "webhook_inbox", "source = 'webhook'"))
	require.Equal(t, 0, b.db.Count(t, "webhook_inbox", "event_id IN ('evt_other', 'evt_young')"))
	require.Equal(t, 10, b.db.Count(t, "webhook_inbox", "source = 'reconcile' AND api_version = $1 AND processed_at IS NULL", stripetest.APIVersion))
	hw, ok := b.highWater(t)
	require.True(t, ok)
	require.Equal(t, now.Add(-reconcile.DefaultSettle), hw.UTC())

	out := b.metrics.String()
	require.Contains(t, out, `"EventsFoundMissing":10`)
	require.Contains(t, out, `"EventType":"invoice.paid"`)
	require.Contains(t, out, `"EventsFoundMissing":7`)
	require.Contains(t, out, `"ReconcileAlreadyPresent":20`)
	require.Contains(t, out, `"ReconcileWindowClamped":0`)
	require.Contains(t, out, `"ReconcileMarkAgeSeconds":3600`)
}

// A window of many pages is listed oldest first: the first page is found by
// probing newest first over a span that halves, then every page is the one
// just newer than the last stored event (ending_before), and the mark moves
// after every stored page, to the newest stored event's second. Several
// events in one second are paged by the event, not the time.
func TestPagesOldestFirstAndTheMarkMovesAfterEachPage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 250 {
		b.api.Add(event(fmt.Sprintf("evt_%03d", i), "refund.updated", time.Duration(250-i)*time.Minute/4+2*time.Hour))
	}
	for i := range 7 {
		b.api.Add(event(fmt.Sprintf("evt_same_%d", i), "refund.updated", 2*time.Hour+30*time.Minute))
	}
	r := b.reconciler(t, reconcile.Config{PageLimit: 25, Slice: time.Hour, Lookback: 4 * time.Hour}, 3)
	s, err := r.Run(context.Background())
	require.NoError(t, err)
	require.True(t, s.Complete)
	require.Equal(t, 257, s.Stored)
	require.Equal(t, 257, s.Events, "each event listed once")
	require.Equal(t, 257, b.db.Count(t, "webhook_inbox", "source = 'reconcile'"))

	reqs := b.api.Requests()
	require.Len(t, reqs, s.Pages)
	probes, pages := 0, 0
	for i, q := range reqs {
		require.Empty(t, q.Get("starting_after"), "request %d", i)
		if q.Get("ending_before") == "" {
			probes++
			require.Zero(t, pages, "probes come before the first ending_before (request %d)", i)
		} else {
			pages++
		}
	}
	require.LessOrEqual(t, probes, 2, "the first hour of the window holds less than a page")
	require.LessOrEqual(t, pages, 257/25+1, "then one request per page of 25")

	marks := b.sink.marks()
	requireIncreasing(t, marks)
	require.GreaterOrEqual(t, len(marks), 257/25, "the mark moves after every page")
	require.Equal(t, now.Add(-reconcile.DefaultSettle), marks[len(marks)-1].UTC())
}

// One second holding more events than a page is listed to its end before
// the mark passes it.
func TestASecondWithMoreThanAPage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 23 {
		b.api.Add(event(fmt.Sprintf("evt_burst_%02d", i), "refund.updated", 3*time.Hour))
	}
	for i := range 5 {
		b.api.Add(event(fmt.Sprintf("evt_after_%d", i), "refund.updated", 2*time.Hour-time.Duration(i)*time.Minute))
	}
	s, err := b.reconciler(t, reconcile.Config{PageLimit: 10, Slice: time.Minute}, 3).Run(context.Background())
	require.NoError(t, err)
	require.True(t, s.Complete)
	require.Equal(t, 28, s.Stored)
	require.Equal(t, 28, b.db.Count(t, "webhook_inbox", ""))
	var afters int
	for _, q := range b.api.Requests() {
		if q.Get("starting_after") != "" {
			afters++
		}
	}
	require.Equal(t, 2, afters, "the burst's second and third pages")
	requireIncreasing(t, b.sink.marks())
}

// Running twice stores nothing new, and the second run re-lists only the
// overlap before the mark.
func TestRunningTwiceStoresNothingNew(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 40 {
		b.api.Add(event(fmt.Sprintf("evt_%02d", i), "invoice.paid", time.Duration(40-i)*time.Minute+reconcile.DefaultSettle+2*time.Minute))
	}
	r := b.reconciler(t, reconcile.Config{PageLimit: 10}, 3)
	s, err := r.Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, 40, s.Stored)

	s, err = r.Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, 0, s.Stored)
	require.Equal(t, 8, s.AlreadyPresent, "the events of the 10 minutes before the mark (the overlap): 63 to 70 minutes old")
	require.Equal(t, 40, b.db.Count(t, "webhook_inbox", ""))

	// A backfill of the whole window, twice: nothing new either time.
	for range 2 {
		s, err = r.Backfill(context.Background(), now.Add(-3*time.Hour), now.Add(-reconcile.DefaultSettle), []string{"invoice.paid"})
		require.NoError(t, err)
		require.Equal(t, 0, s.Stored)
		require.Equal(t, 40, s.AlreadyPresent)
	}
}

// A backfill that reaches into the settle window stores the young events
// too, but does not count them as missing: Stripe may still deliver them.
func TestBackfillCountsOnlySettledEventsAsMissing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 12 {
		b.api.Add(event(fmt.Sprintf("evt_%02d", i), "invoice.paid", time.Duration(i)*10*time.Minute+5*time.Minute))
	}
	s, err := b.reconciler(t, reconcile.Config{PageLimit: 4}, 3).Backfill(context.Background(), now.Add(-3*time.Hour), now, nil)
	require.NoError(t, err)
	require.True(t, s.Complete)
	require.Equal(t, 6, s.StoredUnsettled, "created 5 to 55 minutes ago")
	require.Equal(t, 6, s.Stored, "created 65 to 115 minutes ago: missing")
	require.Equal(t, 12, b.db.Count(t, "webhook_inbox", "source = 'reconcile'"))
	require.Contains(t, b.metrics.String(), `"EventsFoundMissing":6`)
	_, ok := b.highWater(t)
	require.False(t, ok, "a backfill leaves the mark alone")
}

// The mark stays at the last stored page when a page fails; the next run
// lists from there and completes.
func TestHighWaterStaysAtTheLastStoredPage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 36 {
		b.api.Add(event(fmt.Sprintf("evt_%02d", i), "invoice.paid", time.Duration(36-i)*5*time.Minute+reconcile.DefaultSettle))
	}
	cfg := reconcile.Config{Lookback: 4 * time.Hour, Slice: time.Hour, PageLimit: 7}
	// Request 1 probes [−4h, −3h): 12 events, has more; 2 probes 30
	// minutes: 6 events, stored; 3 and 4 page on; 5 fails for good.
	b.api.FailRequest(5, fakeapi.Failure{Status: http.StatusServiceUnavailable})
	s, err := b.reconciler(t, cfg, 1).Run(context.Background())
	require.ErrorContains(t, err, "attempt 1 of 1")
	require.False(t, s.Complete)
	stored := b.db.Count(t, "webhook_inbox", "")
	require.Equal(t, 6+7+7, stored)
	hw, ok := b.highWater(t)
	require.True(t, ok)
	var newest int64
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), "SELECT max((payload->>'created')::bigint) FROM webhook_inbox").Scan(&newest))
	require.Equal(t, time.Unix(newest, 0).UTC(), hw.UTC(), "the newest stored event's second")
	require.Contains(t, err.Error(), "every one before "+hw.UTC().Format(time.RFC3339)+" is stored")

	s, err = b.reconciler(t, cfg, 1).Run(context.Background())
	require.NoError(t, err)
	require.True(t, s.Complete)
	require.Equal(t, 36-stored, s.Stored)
	require.Equal(t, 36, b.db.Count(t, "webhook_inbox", ""))
	hw, _ = b.highWater(t)
	require.Equal(t, now.Add(-reconcile.DefaultSettle), hw.UTC())
	requireIncreasing(t, b.sink.marks())
}

// steppingLister is the client on a clock that moves a fixed step with
// every request: a run's deadline arrives after a number of pages, whatever
// the machine's speed.
type steppingLister struct {
	reconcile.Lister
	mu    sync.Mutex
	clock time.Time
	step  time.Duration
}

func (l *steppingLister) ListPage(ctx context.Context, q reconcile.Query) (reconcile.Page, error) {
	l.mu.Lock()
	l.clock = l.clock.Add(l.step)
	l.mu.Unlock()
	return l.Lister.ListPage(ctx, q)
}

func (l *steppingLister) now() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.clock
}

// TestBacklogCompletesOverSeveralRuns: a backlog larger than one
// invocation's budget (a day's downtime, scaled down: 150 events, pages of
// 10) is reconciled over several runs. Each run stops at its deadline in
// the middle of the window (its clock moves a minute per request and its
// deadline is 10 minutes away, so about ten requests fit), with the mark
// moved forward; the next run goes on from the mark, and the backlog
// completes.
func TestBacklogCompletesOverSeveralRuns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	base := time.Now().Truncate(time.Second)
	for i := range 150 {
		b.api.Add(stripetest.EventWith(fmt.Sprintf("evt_%03d", i), "invoice.paid",
			stripetest.Meta{Created: base.Add(-8*time.Hour + time.Duration(i)*2*time.Minute).Unix()}, stripetest.Invoice(fmt.Sprintf("in_%03d", i), "cus_1", "paid", 100)))
	}
	lister := &steppingLister{Lister: b.client(t, 3), clock: base, step: time.Minute}
	r := b.reconcilerWith(t, lister, reconcile.Config{PageLimit: 10, Slice: time.Hour, Lookback: 9 * time.Hour})
	r.Now = lister.now

	var marks []time.Time
	runs := 0
	for {
		runs++
		require.LessOrEqual(t, runs, 20, "the backlog does not complete")
		// The deadline is 10 minutes away on the run's clock, which reaches
		// it after ten requests; the clock runs ahead of the real one, so
		// the real deadline is further and only guards a hang.
		ctx, cancel := context.WithDeadline(context.Background(), lister.now().Add(10*time.Minute))
		s, err := r.Run(ctx)
		cancel()
		require.NoError(t, err)
		hw, ok := b.highWater(t)
		require.True(t, ok)
		if len(marks) > 0 {
			require.True(t, hw.After(marks[len(marks)-1]), "run %d moved the mark (%s after %s)", runs, hw, marks[len(marks)-1])
		}
		marks = append(marks, hw)
		if s.Complete {
			break
		}
		require.Less(t, s.Reached, s.Until, "stopped mid-window")
	}
	require.GreaterOrEqual(t, runs, 3, "the backlog took several invocations")
	require.Equal(t, 150, b.db.Count(t, "webhook_inbox", "source = 'reconcile'"))
	require.Contains(t, b.metrics.String(), `"EventsFoundMissing":`)
}

// A 429 backs off (at least Retry-After when Stripe sends it) and the run
// finishes; 5xx too. A 401 (a wrong key) fails at once.
func TestRateLimitBacksOffAndFinishes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 15 {
		b.api.Add(event(fmt.Sprintf("evt_%02d", i), "invoice.paid", time.Duration(i+2)*time.Minute+reconcile.DefaultSettle))
	}
	b.api.FailNext(
		fakeapi.Failure{Status: http.StatusTooManyRequests, Headers: map[string]string{"Retry-After": "7", "Stripe-Rate-Limited-Reason": "global-rate"}},
		fakeapi.Failure{Status: http.StatusTooManyRequests},
		fakeapi.Failure{Status: http.StatusInternalServerError},
	)
	s, err := b.reconciler(t, reconcile.Config{PageLimit: 10, Slice: time.Hour}, 5).Run(context.Background())
	require.NoError(t, err)
	require.True(t, s.Complete)
	require.Equal(t, 15, s.Stored)
	require.Len(t, b.api.Requests(), 3+s.Pages)
	require.Len(t, b.sleeps, 3)
	require.GreaterOrEqual(t, b.sleeps[0], 7*time.Second, "Retry-After honoured")
	require.Less(t, b.sleeps[1], 7*time.Second, "no Retry-After: the backoff")

	bad, err := reconcile.NewClient(reconcile.ClientConfig{Key: "rk_test_wrong", BaseURL: b.api.URL, MaxAttempts: 5})
	require.NoError(t, err)
	_, err = bad.ListPage(context.Background(), reconcile.Query{Types: []string{"invoice.paid"}, Since: now.Add(-time.Hour), Until: now})
	require.ErrorContains(t, err, "attempt 1 of 5")
	require.ErrorContains(t, err, "Invalid API Key")
}

// After a 401 the client fetches the key again, once: a key an operator
// rolled in Secrets Manager works without a cold start; a key that is still
// refused fails the request.
func TestRolledKeyIsFetchedAgainAfter401(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.api.Add(event("evt_1", "invoice.paid", 2*time.Hour))
	var mu sync.Mutex
	stored, fetches := fakeapi.Key, 0
	client, err := reconcile.NewClient(reconcile.ClientConfig{
		Key: fakeapi.Key, BaseURL: b.api.URL, Rate: 1000, MaxAttempts: 3,
		RefetchKey: func(context.Context) (string, error) {
			mu.Lock()
			defer mu.Unlock()
			fetches++
			return stored, nil
		},
		Logger: slog.New(slog.NewJSONHandler(io.Discard, nil)),
	})
	require.NoError(t, err)
	q := reconcile.Query{Types: []string{"invoice.paid"}, Since: now.Add(-3 * time.Hour), Until: now}

	// The operator rolls the key: Stripe refuses the old one.
	b.api.SetKey("rk_test_rolled")
	mu.Lock()
	stored = "rk_test_rolled"
	mu.Unlock()
	p, err := client.ListPage(context.Background(), q)
	require.NoError(t, err)
	require.Len(t, p.Events, 1)
	_, err = client.ListPage(context.Background(), q)
	require.NoError(t, err)
	require.Equal(t, 1, fetches, "fetched once, then the new key is kept")

	// A key Stripe refuses that is still the one stored: one fetch, then
	// the 401.
	b.api.SetKey("rk_test_other")
	_, err = client.ListPage(context.Background(), q)
	require.ErrorContains(t, err, "Invalid API Key")
	require.Equal(t, 2, fetches)
}

// More than 20 types are listed in groups of at most 20 (Stripe's limit on
// types[]); each group pages on its own, and the mark is the least of their
// progress.
func TestMoreThanTwentyTypesAreListedInGroups(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var types []string
	for i := range 25 {
		typ := fmt.Sprintf("thing.t%02d", i)
		types = append(types, typ)
		b.api.Add(event(fmt.Sprintf("evt_%02d", i), typ, time.Duration(i+2)*time.Minute+reconcile.DefaultSettle))
	}
	s, err := b.reconciler(t, reconcile.Config{Types: types, Slice: time.Hour, Lookback: 2 * time.Hour}, 1).Run(context.Background())
	require.NoError(t, err)
	require.True(t, s.Complete)
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
	hw, _ := b.highWater(t)
	require.Equal(t, now.Add(-reconcile.DefaultSettle), hw.UTC())
}

// A mark older than Stripe's 30 days (the reconciler was off for longer) is
// clamped at the horizon, and says so in a metric (alarmed) and the log.
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
	require.Contains(t, b.metrics.String(), `"ReconcileWindowClamped":1`)
}

// The listed copy and the delivery of one event, in two API versions, in
// both orders: one receipt, the delivery's version, one booking.
func TestListedAndDeliveredInEitherOrderBookOnce(t *testing.T) {
	t.Parallel()
	shapes := stripetest.Shapes()
	listedShape, deliveredShape := shapes[0], shapes[5] // 2024-06-20 (the account's when created), dahlia (the endpoint's)
	for _, order := range []string{"listed first", "delivered first"} {
		t.Run(order, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			created := now.Add(-2 * time.Hour).Unix()
			listed := listedShape.Story("x", created)[2] // invoice.paid
			delivery := deliveredShape.Story("x", created)[2]
			require.Equal(t, listed.ID, delivery.ID)
			b.api.Add(listed.Payload)
			r := b.reconciler(t, reconcile.Config{}, 3)
			switch order {
			case "listed first":
				s, err := r.Run(context.Background())
				require.NoError(t, err)
				require.Equal(t, 1, s.Stored)
				require.Equal(t, inbox.Replaced, b.deliver(t, delivery.Payload))
			case "delivered first":
				require.Equal(t, inbox.Stored, b.deliver(t, delivery.Payload))
				s, err := r.Run(context.Background())
				require.NoError(t, err)
				require.Equal(t, 1, s.AlreadyPresent)
				require.Zero(t, s.Stored)
			}
			require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "event_id = $1 AND source = 'webhook' AND api_version = $2", delivery.ID, deliveredShape.Version))
			require.Equal(t, order == "listed first", b.db.Count(t, "webhook_inbox", "listed_first") == 1)

			w := newWorker(t, b.db)
			s, err := w.Run(context.Background())
			require.NoError(t, err)
			require.Equal(t, 1, s.Processed)
			require.Equal(t, 1, b.db.Count(t, "ledger_entries", "invoice_id = 'in_x' AND kind = 'payment' AND amount = $1", stripetest.StoryAmount))
			require.Equal(t, 1, b.db.Count(t, "ledger_entries", ""))
			require.Equal(t, 0, b.db.Count(t, "webhook_inbox", "processed_at IS NULL"))

			// A later delivery, or the next run's listing, changes nothing.
			require.Equal(t, inbox.Duplicate, b.deliver(t, delivery.Payload))
			_, err = r.Run(context.Background())
			require.NoError(t, err)
			require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "api_version = $1", deliveredShape.Version))
		})
	}
}

// newWorker is a test-mode worker on db, as internal/worker's tests build it.
func newWorker(t *testing.T, db *pgtest.Database) *worker.Worker {
	t.Helper()
	pool, err := database.Open(context.Background(), database.Config{URL: db.URL, MaxConns: 4, PreparedStatements: true}, nil)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	cfg := worker.Config{Mode: worker.ModeTest, Concurrency: 1, DeadlineMargin: 6 * time.Second, StatementTimeout: time.Second, Lease: time.Minute}.WithDefaults()
	require.NoError(t, cfg.Validate())
	w, err := worker.New(pool, handlers.Default(), cfg, slog.New(slog.NewJSONHandler(io.Discard, nil)), nil)
	require.NoError(t, err)
	return w
}

// Configuration mistakes are refused with what to fix.
func TestConfigValidate(t *testing.T) {
	t.Parallel()
	err := reconcile.Config{Endpoint: "billing", Types: []string{"a"}, Settle: 100 * time.Hour, Lookback: 31 * 24 * time.Hour}.WithDefaults().Validate()
	require.ErrorContains(t, err, "RECONCILE_SETTLE=100h0m0s: must be from 0 to 72h0m0s (Stripe retries for up to three days)")
	require.ErrorContains(t, err, "RECONCILE_LOOKBACK=744h0m0s")
	require.Equal(t, time.Hour, reconcile.Config{}.WithDefaults().Settle)
}
