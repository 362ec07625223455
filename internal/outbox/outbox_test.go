package outbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/database"
	"github.com/stripe-inbox/inbox/internal/eventbridgetest"
	"github.com/stripe-inbox/inbox/internal/metrics"
	"github.com/stripe-inbox/inbox/internal/outbox"
	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/retention"
)

const bus = "stripe-inbox-test"

type testBundle struct {
	db      *pgtest.Database
	pool    *pgxpool.Pool
	eb      *eventbridgetest.Server
	metrics *bytes.Buffer
	logs    *bytes.Buffer
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	db := pgtest.DB(t)
	pool, err := database.Open(context.Background(), database.Config{URL: db.URL, MaxConns: 10}, nil)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return &testBundle{db: db, pool: pool, eb: eventbridgetest.New(t, bus), metrics: &bytes.Buffer{}, logs: &bytes.Buffer{}}
}

// relay builds a relay on the stand-in with cfg over the defaults. The
// SDK's own retries are off (RetryMaxAttempts 1) so that each call the
// relay makes is one call the stand-in sees; the relay's behaviour after a
// throttled or failed call is what these tests look at.
func (b *testBundle) relay(t *testing.T, cfg outbox.Config) *outbox.Relay {
	t.Helper()
	return b.relayOn(t, b.pool, cfg)
}

// relayOn is relay on another pool.
func (b *testBundle) relayOn(t *testing.T, pool *pgxpool.Pool, cfg outbox.Config) *outbox.Relay {
	t.Helper()
	if cfg.Bus == "" {
		cfg.Bus = bus
	}
	client := b.eb.Client(func(o *eventbridge.Options) { o.RetryMaxAttempts = 1 })
	em := metrics.New(b.metrics, "Test", map[string]string{"Service": "worker"})
	r, err := outbox.New(pool, client, cfg, slog.New(slog.NewJSONHandler(b.logs, nil)), em)
	require.NoError(t, err)
	return r
}

// insert adds n outbox rows with payloads of about size bytes (at least a
// small JSON object) and returns their ids.
func (b *testBundle) insert(t *testing.T, n, size int) []int64 {
	t.Helper()
	ids := make([]int64, 0, n)
	for i := range n {
		payload, _ := json.Marshal(map[string]any{"invoice_id": fmt.Sprintf("in_%d", i), "amount": 2000 + i, "currency": "usd",
			"pad": strings.Repeat("x", max(size-60, 0))})
		var id int64
		require.NoError(t, b.pool.QueryRow(context.Background(),
			`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('Invoice', $1, 'InvoicePaymentBooked', $2) RETURNING id`,
			fmt.Sprintf("in_%d", i), string(payload)).Scan(&id))
		ids = append(ids, id)
	}
	return ids
}

func run(t *testing.T, r *outbox.Relay) outbox.Summary {
	t.Helper()
	s, err := r.Run(context.Background())
	require.NoError(t, err)
	return s
}

func at(ts time.Time) func() *time.Time { return func() *time.Time { return &ts } }

func TestBatchIsPublishedAndMarked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.insert(t, 25, 100)
	r := b.relay(t, outbox.Config{})

	s := run(t, r)
	require.Equal(t, 25, s.Published)
	require.Equal(t, 3, s.Calls, "10 + 10 + 5 entries")
	require.Equal(t, 0, b.db.Count(t, "outbox", "published_at IS NULL"))
	require.Equal(t, 25, b.db.Count(t, "outbox", "attempts = 1 AND claim_token IS NULL AND leased_until IS NULL"))

	events := b.eb.Events()
	require.Len(t, events, 25)
	for i, e := range events {
		require.Equal(t, bus, e.Bus)
		require.Equal(t, "stripe-inbox", e.Source)
		require.Equal(t, "InvoicePaymentBooked", e.DetailType)
		require.Equal(t, ids[i], e.OutboxID(), "oldest first")
		require.False(t, e.Time.IsZero())
		var d outbox.Detail
		require.NoError(t, json.Unmarshal(e.Detail, &d))
		require.Equal(t, "Invoice", d.AggregateType)
		require.Equal(t, fmt.Sprintf("in_%d", i), d.AggregateID)
		var data map[string]any
		require.NoError(t, json.Unmarshal(d.Data, &data))
		require.Equal(t, fmt.Sprintf("in_%d", i), data["invoice_id"])
		require.Equal(t, e.Time.Unix(), d.OccurredAt.Unix(), "Time is the row's created_at")
	}

	// Nothing left: the next run claims nothing and calls nothing.
	s = run(t, r)
	require.Equal(t, 0, s.Calls)
	require.Len(t, b.eb.Events(), 25)
}

func TestPartialFailureRepublishesOnlyTheFailedEntries(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.insert(t, 10, 100)
	bad := map[int64]bool{ids[2]: true, ids[7]: true}
	var mu sync.Mutex
	failedOnce := map[string]bool{}
	b.eb.FailEntries(func(e eventbridgetest.Entry) string {
		mu.Lock()
		defer mu.Unlock()
		ev := eventbridgetest.Event{Detail: json.RawMessage(e.Detail)}
		if bad[ev.OutboxID()] && !failedOnce[e.Detail] {
			failedOnce[e.Detail] = true
			return "InternalFailure"
		}
		return ""
	})
	r := b.relay(t, outbox.Config{})

	s := run(t, r)
	require.Equal(t, 8, s.Published)
	require.Equal(t, 2, s.Failed)
	require.Equal(t, 2, b.db.Count(t, "outbox", "published_at IS NULL AND attempts = 1 AND last_error LIKE 'InternalFailure%' AND available_at > now()"))

	// They are retried after their backoff, alone.
	r.Now = at(time.Now().Add(time.Hour))
	s = run(t, r)
	require.Equal(t, 2, s.Published)
	require.Equal(t, 0, b.db.Count(t, "outbox", "published_at IS NULL"))
	events := b.eb.Events()
	require.Len(t, events, 10, "each row accepted exactly once")
	var second []int64
	for _, e := range events {
		if e.Call == 2 {
			second = append(second, e.OutboxID())
		}
	}
	require.ElementsMatch(t, []int64{ids[2], ids[7]}, second, "the second call carries only the failed entries")
	require.Equal(t, 2, b.db.Count(t, "outbox", "attempts = 2"))
}

func TestThrottledCallBacksOffWithoutCountingAnAttemptAndFinishes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insert(t, 15, 100)
	b.eb.ThrottleCalls(2)
	r := b.relay(t, outbox.Config{BackoffBase: time.Hour, BackoffCap: 4 * time.Hour})
	start := time.Now()

	s := run(t, r)
	require.Equal(t, 0, s.Published)
	require.Equal(t, 10, s.Throttled)
	require.Equal(t, 15, s.Released, "the throttled call's rows and the unsent ones")
	require.Equal(t, 15, b.db.Count(t, "outbox", "published_at IS NULL AND attempts = 0 AND claim_token IS NULL AND available_at >= $1", start.Add(30*time.Minute)))

	// Paused: no call while the backoff runs.
	s = run(t, r)
	require.True(t, s.Paused)
	require.Equal(t, 1, b.eb.Calls())

	// Past the pause, throttled again: the pause grows (2 hours, jittered
	// to 1-2 h, after 0.5-1 h).
	r.Now = at(start.Add(time.Hour + time.Minute))
	s = run(t, r)
	require.Equal(t, 10, s.Throttled)
	require.Equal(t, 2, b.eb.Calls())
	r.Now = at(start.Add(time.Hour + 2*time.Minute))
	require.True(t, run(t, r).Paused)

	r.Now = at(start.Add(4 * time.Hour))
	s = run(t, r)
	require.Equal(t, 15, s.Published)
	require.Equal(t, 0, b.db.Count(t, "outbox", "published_at IS NULL"))
	require.Equal(t, 15, b.db.Count(t, "outbox", "attempts = 1"), "throttling used no attempt")
}

func TestThrottledEntriesBackOffAndTheOthersArePublished(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.insert(t, 10, 100)
	var mu sync.Mutex
	n := 0
	b.eb.FailEntries(func(e eventbridgetest.Entry) string {
		mu.Lock()
		defer mu.Unlock()
		n++
		if n <= 10 && n%3 == 0 { // entries 3, 6, 9 of the first call
			return "ThrottlingException"
		}
		return ""
	})
	r := b.relay(t, outbox.Config{BackoffBase: time.Hour, BackoffCap: 4 * time.Hour})
	s := run(t, r)
	require.Equal(t, 7, s.Published)
	require.Equal(t, 3, s.Throttled)
	require.Equal(t, 3, b.db.Count(t, "outbox", "published_at IS NULL AND attempts = 0 AND last_error LIKE 'throttled%'"))
	require.True(t, run(t, r).Paused)

	r.Now = at(time.Now().Add(2 * time.Hour))
	s = run(t, r)
	require.Equal(t, 3, s.Published)
	require.Equal(t, map[int64]int{ids[2]: 1, ids[5]: 1, ids[8]: 1}, onlyCall(b.eb.Events(), 2))
	require.Equal(t, 0, b.db.Count(t, "outbox", "published_at IS NULL"))
}

func TestFailedCallGivesRowsBackUncounted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insert(t, 5, 100)
	b.eb.FailCalls(1, 503)
	r := b.relay(t, outbox.Config{BackoffBase: time.Hour, BackoffCap: 4 * time.Hour})
	s := run(t, r)
	require.Equal(t, 1, s.CallFails)
	require.Equal(t, 5, b.db.Count(t, "outbox", "published_at IS NULL AND attempts = 0 AND last_error LIKE 'call failed: InternalException%'"))
	r.Now = at(time.Now().Add(2 * time.Hour))
	require.Equal(t, 5, run(t, r).Published)

	// A bus that does not exist fails every call as a whole: nothing is
	// parked however long it lasts.
	b.insert(t, 2, 100)
	wrong := b.relay(t, outbox.Config{Bus: "no-such-bus", MaxAttempts: 1, BackoffBase: 10 * time.Millisecond, BackoffCap: 10 * time.Millisecond})
	for i := range 5 {
		wrong.Now = at(time.Now().Add(time.Duration(i+1) * time.Hour))
		s := run(t, wrong)
		require.Equal(t, 1, s.CallFails)
	}
	require.Equal(t, 2, b.db.Count(t, "outbox", "published_at IS NULL AND attempts = 0 AND last_error LIKE 'call failed: ResourceNotFoundException%'"))
}

// A claim the server committed whose answer reached the relay only after
// the run's context ended (a resident run's stopAt, say) gives its rows
// back, due at once and their attempt uncounted: they are published by the
// next run, not after their lease. The answer is held on the wire (the
// client's reads wait on a gate) until the claim has committed and the
// context is cancelled.
func TestAClaimAnsweredAfterTheRunEndedGivesItsRowsBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool, gate := b.db.GatedPool(t, 1)
	r := b.relayOn(t, pool, outbox.Config{})
	// A first run (nothing due) prepares the claim on the pool's one
	// connection: pgx prepares a statement the first time, and waits for
	// that answer before it sends the statement.
	require.Equal(t, 0, run(t, r).Published)
	b.insert(t, 3, 100)

	gate.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := r.Run(ctx)
		done <- err
	}()
	b.db.WaitUntil(t, "the claim has committed", "SELECT count(*) = 3 FROM outbox WHERE claim_token IS NOT NULL")
	cancel()
	gate.OpenOnDeadline(time.Second)
	require.NoError(t, <-done)

	require.Empty(t, b.eb.Events(), "nothing is sent once the run has ended")
	require.Equal(t, 3, b.db.Count(t, "outbox", "published_at IS NULL AND claim_token IS NULL AND attempts = 0 AND available_at <= now()"),
		"the claimed rows are given back, due now, attempt uncounted")
	require.Equal(t, 3, run(t, r).Published)
}

func onlyCall(events []eventbridgetest.Event, call int) map[int64]int {
	m := map[int64]int{}
	for _, e := range events {
		if e.Call == call {
			m[e.OutboxID()]++
		}
	}
	return m
}

// A relay whose lease expired while its PutEvents call was held up cannot
// mark the rows another relay claimed since: the other one's claim and mark
// stand, the late mark changes nothing, and the rows were published twice
// (at least once; consumers de-duplicate on outbox_id).
func TestAnExpiredRelayCannotMarkRowsAnotherOneClaimed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.insert(t, 4, 100)

	held := make(chan struct{})
	release := make(chan struct{})
	b.eb.Hold(func(call int, _ *http.Request) {
		if call == 1 {
			close(held)
			<-release
		}
	})
	// Two relays, each with its own connections (pools on the same database).
	slow := b.relay(t, outbox.Config{Lease: time.Minute})
	otherPool, err := database.Open(context.Background(), database.Config{URL: b.db.URL, MaxConns: 2}, nil)
	require.NoError(t, err)
	t.Cleanup(otherPool.Close)
	other, err := outbox.New(otherPool, b.eb.Client(func(o *eventbridge.Options) { o.RetryMaxAttempts = 1 }), outbox.Config{Bus: bus, Lease: time.Minute}, nil, nil)
	require.NoError(t, err)

	type result struct {
		s   outbox.Summary
		err error
	}
	done := make(chan result, 1)
	go func() {
		s, err := slow.Run(context.Background())
		done <- result{s, err}
	}()
	<-held // the slow relay's call was accepted; its answer is held
	var slowToken string
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT min(claim_token::text) FROM outbox").Scan(&slowToken))
	require.Equal(t, 4, b.db.Count(t, "outbox", "claim_token = $1", slowToken))

	// Within the slow relay's lease the other one takes nothing.
	s, err := other.Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, 0, s.Calls)

	// After it, the other relay claims the rows, publishes and marks them.
	other.Now = at(time.Now().Add(2 * time.Minute))
	s, err = other.Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, 4, s.Published)
	var markedAt time.Time
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT max(published_at) FROM outbox").Scan(&markedAt))

	// The slow relay's call returns: its mark finds other tokens.
	close(release)
	res := <-done
	require.NoError(t, res.err)
	require.Equal(t, 0, res.s.Published)
	require.Equal(t, 4, res.s.Fenced)
	require.Equal(t, 4, b.db.Count(t, "outbox", "published_at = $1 AND attempts = 2", markedAt), "the other relay's mark stands")
	require.Equal(t, map[int64]int{ids[0]: 2, ids[1]: 2, ids[2]: 2, ids[3]: 2}, b.eb.Published())
}

// A fenced relay cannot record a failure on, or release, rows it no longer
// owns either.
func TestAnExpiredRelayCannotFailOrReleaseRowsAnotherOneMarked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insert(t, 3, 100)
	held := make(chan struct{})
	release := make(chan struct{})
	b.eb.Hold(func(call int, _ *http.Request) {
		if call == 1 {
			close(held)
			<-release
		}
	})
	slow := b.relay(t, outbox.Config{Lease: time.Minute})
	// The slow relay's entries all fail (its call is the held one).
	b.eb.AddFault(func(call int, es []eventbridgetest.Entry) (int, string, []string) {
		if call != 1 {
			return 0, "", nil
		}
		codes := make([]string, len(es))
		for i := range codes {
			codes[i] = "InternalFailure"
		}
		return 0, "", codes
	})
	done := make(chan outbox.Summary, 1)
	go func() {
		s, _ := slow.Run(context.Background())
		done <- s
	}()
	<-held
	other := b.relay(t, outbox.Config{Lease: time.Minute})
	other.Now = at(time.Now().Add(2 * time.Minute))
	require.Equal(t, 3, run(t, other).Published)
	close(release)
	s := <-done
	require.Equal(t, 3, s.Failed)
	require.Equal(t, 3, b.db.Count(t, "outbox", "published_at IS NOT NULL AND last_error IS NULL AND available_at < 'infinity'"))
}

func TestEntriesOver256KBInTotalAreSplitAcrossCalls(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insert(t, 7, 100*1024) // about 100 KB each: two per call
	r := b.relay(t, outbox.Config{})
	s := run(t, r)
	require.Equal(t, 7, s.Published)
	require.Equal(t, 4, s.Calls, "2 + 2 + 2 + 1")
	perCall := map[int]int{}
	for _, e := range b.eb.Events() {
		perCall[e.Call] += len(e.Source) + len(e.DetailType) + len(e.Detail) + 14
	}
	for call, n := range perCall {
		require.LessOrEqual(t, n, outbox.MaxCallBytes, "call %d", call)
	}

	// A row too large for any call is never sent: it fails, and waits for a
	// human at the attempt limit.
	big := b.insert(t, 1, 300*1024)
	r2 := b.relay(t, outbox.Config{MaxAttempts: 1})
	s = run(t, r2)
	require.Equal(t, 1, s.Failed)
	require.Equal(t, 0, s.Calls)
	require.Equal(t, 1, b.db.Count(t, "outbox", "id = $1 AND available_at = 'infinity' AND last_error LIKE 'invalid: %over the 262144 bytes%'", big[0]))
}

func TestEntrySizeIsComputedAsAWSDocumentsIt(t *testing.T) {
	t.Parallel()
	src, dt, detail := "stripe-inbox", "InvoicePaymentBooked", `{"outbox_id":1}`
	now := time.Now()
	e := outboxEntry(src, dt, detail, &now, "arn:aws:x")
	require.Equal(t, 14+len(src)+len(dt)+len(detail)+len("arn:aws:x"), outbox.EntrySize(e))
	e = outboxEntry(src, dt, detail, nil)
	require.Equal(t, len(src)+len(dt)+len(detail), outbox.EntrySize(e))
}

func TestRowsThatKeepFailingWaitForAHumanAndCanBeRetried(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.insert(t, 3, 100)
	var mu sync.Mutex
	broken := true
	b.eb.FailEntries(func(e eventbridgetest.Entry) string {
		mu.Lock()
		defer mu.Unlock()
		if broken && strings.Contains(e.Detail, fmt.Sprintf(`"outbox_id":%d,`, ids[1])) {
			return "MalformedDetail"
		}
		return ""
	})
	r := b.relay(t, outbox.Config{MaxAttempts: 3})
	clock := time.Now()
	for range 3 {
		r.Now = at(clock)
		run(t, r)
		clock = clock.Add(time.Hour)
	}
	require.Equal(t, 1, b.db.Count(t, "outbox", "id = $1 AND published_at IS NULL AND attempts = 3 AND available_at = 'infinity'", ids[1]))
	calls := b.eb.Calls()
	r.Now = at(clock.Add(24 * time.Hour))
	require.Equal(t, 0, run(t, r).Calls, "a parked row is not claimed")
	require.Equal(t, calls, b.eb.Calls())

	bl, err := outbox.ReadBacklog(context.Background(), b.pool, 3, nil)
	require.NoError(t, err)
	require.Equal(t, outbox.Backlog{Count: 0, OldestAgeSeconds: 0, NeedsReview: 1}, bl)
	waiting, err := outbox.ListWaiting(context.Background(), b.pool, 3, 100)
	require.NoError(t, err)
	require.Len(t, waiting, 1)
	require.Equal(t, ids[1], waiting[0].ID)
	require.Equal(t, 3, waiting[0].Attempts)
	require.Contains(t, waiting[0].LastError, "MalformedDetail")

	// The metric the alarm watches.
	_, err = r.PublishDue(context.Background(), true)
	require.NoError(t, err)
	require.Contains(t, b.metrics.String(), `"OutboxNeedsReviewCount":1`)

	// Fixed; retried by the operator: published.
	mu.Lock()
	broken = false
	mu.Unlock()
	n, err := outbox.Retry(context.Background(), b.pool, 3, []int64{ids[1]})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	r.Now = func() *time.Time { return nil }
	require.Equal(t, 1, run(t, r).Published)
	require.Equal(t, 0, b.db.Count(t, "outbox", "published_at IS NULL"))
}

// A relay that died during a row's last attempt leaves it with its attempts
// used up and no failure recorded; the end-of-run report parks it with the
// others waiting for a human.
func TestRowsWhoseLastAttemptDiedAreParked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.insert(t, 1, 100)
	_, err := b.pool.Exec(context.Background(), "UPDATE outbox SET attempts = 10, available_at = now() - interval '1 minute', claim_token = gen_random_uuid(), leased_until = now() - interval '1 minute'")
	require.NoError(t, err)
	r := b.relay(t, outbox.Config{})
	_, err = r.PublishDue(context.Background(), true)
	require.NoError(t, err)
	require.Equal(t, 1, b.db.Count(t, "outbox", "id = $1 AND available_at = 'infinity' AND claim_token IS NULL AND last_error LIKE 'attempts used up%'", ids[0]))
	require.Contains(t, b.metrics.String(), `"OutboxNeedsReviewCount":1`)
	require.Contains(t, b.metrics.String(), `"OutboxBacklogCount":0`)
}

// Published rows follow the retention (the purge deletes them once older
// than it); unpublished rows, whether due, claimed, backing off or waiting
// for a human, are never purged however old.
func TestPurgeDeletesPublishedRowsAndNeverUnpublishedOnes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insert(t, 8, 100)
	_, err := b.pool.Exec(context.Background(), `
UPDATE outbox SET created_at = now() - interval '400 days',
  published_at = CASE WHEN id % 4 = 0 THEN now() - interval '400 days' END,
  attempts = CASE id % 4 WHEN 1 THEN 10 WHEN 2 THEN 1 ELSE 0 END,
  available_at = CASE id % 4 WHEN 1 THEN 'infinity'::timestamptz WHEN 2 THEN now() + interval '1 hour' ELSE available_at END,
  claim_token = CASE WHEN id % 4 = 2 THEN gen_random_uuid() END`)
	require.NoError(t, err)
	published := b.db.Count(t, "outbox", "published_at IS NOT NULL")
	require.Equal(t, 2, published)
	p, err := retention.New(b.pool, retention.Config{}, slog.New(slog.DiscardHandler), nil)
	require.NoError(t, err)
	s, err := p.Run(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 2, s.PurgedOutbox)
	require.Equal(t, 6, b.db.Count(t, "outbox", "published_at IS NULL"))
	require.Equal(t, 0, b.db.Count(t, "outbox", "published_at IS NOT NULL"))
}

func TestConfigNamesEachWrongSetting(t *testing.T) {
	t.Parallel()
	err := outbox.Config{Bus: "bad bus!", ClaimLimit: 100, Lease: 10 * time.Second, CallTimeout: 5 * time.Second, BackoffBase: time.Minute, BackoffCap: time.Second}.WithDefaults().Validate()
	require.Error(t, err)
	for _, want := range []string{"OUTBOX_BUS", "OUTBOX_LEASE=10s must exceed", "OUTBOX_BACKOFF_CAP=1s must be at least"} {
		require.ErrorContains(t, err, want)
	}
	require.NoError(t, outbox.Config{Bus: bus}.WithDefaults().Validate())
	require.NoError(t, outbox.Config{Bus: "arn:aws:events:us-east-1:123456789012:event-bus/stripe-inbox-prod"}.WithDefaults().Validate())
}

func outboxEntry(source, detailType, detail string, at *time.Time, resources ...string) types.PutEventsRequestEntry {
	return types.PutEventsRequestEntry{Source: &source, DetailType: &detailType, Detail: &detail, Time: at, Resources: resources}
}
