package inbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/stripeevent"
	"github.com/stripe-inbox/inbox/internal/stripetest"
)

// The inbox's operations on their own, on a real migrated database. "Now"
// is passed in (an hour ahead of the database's clock, so that every
// receipt stored here is due), never slept for.

const secret = "whsec_inbox_test"

type testBundle struct {
	db  *pgtest.Database
	now time.Time
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	return &testBundle{db: pgtest.DB(t), now: time.Now().Add(time.Hour).UTC().Truncate(time.Millisecond)}
}

// event is a verified event, as the webhook hands it to Store.
func event(t *testing.T, id string, m stripetest.Meta) stripeevent.Event {
	t.Helper()
	payload := stripetest.EventWith(id, "invoice.paid", m, stripetest.Invoice("in_"+id, "cus_1", "paid", 1000))
	ev, err := stripeevent.Verify(payload, stripetest.Sign(payload, time.Now(), secret), []string{secret})
	require.NoError(t, err)
	return ev
}

func (b *testBundle) store(t *testing.T, ids ...string) {
	t.Helper()
	for _, id := range ids {
		outcome, err := inbox.Store(context.Background(), b.db.Pool, "billing", event(t, id, stripetest.Meta{Created: stripetest.Created}))
		require.NoError(t, err)
		require.Equal(t, inbox.Stored, outcome)
	}
}

func (b *testBundle) claim(t *testing.T, at time.Time, maxAttempts, limit int) []inbox.Claimed {
	t.Helper()
	c, err := inbox.Claim(context.Background(), b.db.Pool, inbox.ClaimParams{Now: &at, MaxAttempts: maxAttempts, Limit: limit, Lease: time.Minute})
	require.NoError(t, err)
	return c
}

// storeKeys stores n receipts, prefix0 to prefix<n-1>, and returns their keys.
func (b *testBundle) storeKeys(t *testing.T, prefix string, n int) []inbox.Key {
	t.Helper()
	var keys []inbox.Key
	for i := range n {
		id := fmt.Sprintf("%s%d", prefix, i)
		b.store(t, id)
		keys = append(keys, key(id))
	}
	return keys
}

func key(id string) inbox.Key {
	return inbox.Key{Provider: inbox.ProviderStripe, Endpoint: "billing", EventID: id}
}

func TestStoreKeepsOneReceiptPerEndpointAndEvent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	ev := event(t, "evt_1", stripetest.Meta{Created: stripetest.Created, Livemode: true, Account: "acct_1"})

	for _, want := range []inbox.StoreOutcome{inbox.Stored, inbox.Duplicate, inbox.Duplicate} {
		got, err := inbox.Store(ctx, b.db.Pool, "billing", ev)
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
	got, err := inbox.Store(ctx, b.db.Pool, "connect", ev)
	require.NoError(t, err)
	require.Equal(t, inbox.Stored, got, "another endpoint's copy is a receipt of its own")
	require.Equal(t, 2, b.db.Count(t, "webhook_inbox", ""))
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox",
		`endpoint = 'billing' AND event_id = 'evt_1' AND event_type = 'invoice.paid' AND livemode AND account = 'acct_1'
		 AND object_id = 'in_evt_1' AND api_version = $1 AND attempts = 0 AND processed_at IS NULL
		 AND payload = $2::jsonb AND payload_raw IS NULL`, stripetest.APIVersion, string(ev.Payload)))
}

// TestClaimCountsTheAttemptAndHidesForTheLease: a claim takes at most its
// limit, oldest first, counts an attempt on each, and hides them until the
// lease ends; at the limit of attempts a receipt is no longer claimed.
func TestClaimCountsTheAttemptAndHidesForTheLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.store(t, "evt_1", "evt_2", "evt_3")
	const maxAttempts = 2

	first := b.claim(t, b.now, maxAttempts, 2)
	require.Len(t, first, 2)
	for _, c := range first {
		require.Equal(t, 1, c.Attempts)
		require.Equal(t, "invoice.paid", c.EventType)
		require.Equal(t, "in_"+c.EventID, c.LockKey, "an invoice event belongs to its own invoice")
	}
	rest := b.claim(t, b.now, maxAttempts, 10)
	require.Len(t, rest, 1, "the first two are leased")
	require.NotContains(t, []string{first[0].EventID, first[1].EventID}, rest[0].EventID)
	require.Empty(t, b.claim(t, b.now.Add(59*time.Second), maxAttempts, 10), "within the lease")

	again := b.claim(t, b.now.Add(time.Minute), maxAttempts, 10)
	require.Len(t, again, 3, "the lease has ended")
	for _, c := range again {
		require.Equal(t, 2, c.Attempts)
	}
	// That was their last attempt: leased like any other (the lease is how
	// an operator's retry tells a held receipt), never claimed again, and
	// once the lease has ended without an outcome (the process died), the
	// worker's run parks them for review.
	require.Equal(t, 3, b.db.Count(t, "webhook_inbox", "available_at = $1", b.now.Add(2*time.Minute)))
	require.Empty(t, b.claim(t, b.now.Add(24*time.Hour), maxAttempts, 10))
	within := b.now.Add(time.Minute)
	parked, err := inbox.ParkNeedsReview(context.Background(), b.db.Pool, maxAttempts, &within)
	require.NoError(t, err)
	require.Zero(t, parked, "within the lease")
	after := b.now.Add(2 * time.Minute)
	parked, err = inbox.ParkNeedsReview(context.Background(), b.db.Pool, maxAttempts, &after)
	require.NoError(t, err)
	require.Equal(t, 3, parked)
	require.Equal(t, 3, b.db.Count(t, "webhook_inbox", "available_at = 'infinity'"))
	backlog, err := inbox.Stats(context.Background(), b.db.Pool, maxAttempts, &b.now)
	require.NoError(t, err)
	require.Equal(t, inbox.Backlog{NeedsReview: 3}, backlog)
}

// TestLockThenMarkProcessed: a receipt locked and marked in one
// transaction is processed; the lock of a processed receipt finds nothing,
// and marking it again is an error (the caller never books twice).
func TestLockThenMarkProcessed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	ev := event(t, "evt_1", stripetest.Meta{Created: stripetest.Created, Livemode: true, Account: "acct_9"})
	_, err := inbox.Store(ctx, b.db.Pool, "billing", ev)
	require.NoError(t, err)
	require.Len(t, b.claim(t, b.now, 10, 10), 1)

	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	locked, found, err := inbox.Lock(ctx, tx, key("evt_1"))
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, inbox.Locked{EventType: "invoice.paid", Payload: locked.Payload, Livemode: true, Account: "acct_9"}, locked)
	require.JSONEq(t, string(ev.Payload), string(locked.Payload))
	latency, err := inbox.MarkProcessed(ctx, tx, key("evt_1"), "applied", &b.now)
	require.NoError(t, err)
	require.Greater(t, latency, 59*time.Minute, "processed_at - received_at, with processed_at the given now")
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "processed_at = $1 AND outcome = 'applied' AND last_error IS NULL", b.now))

	_, found, err = inbox.Lock(ctx, b.db.Pool, key("evt_1"))
	require.NoError(t, err)
	require.False(t, found, "a processed receipt is not locked again")
	_, err = inbox.MarkProcessed(ctx, b.db.Pool, key("evt_1"), "applied", nil)
	require.ErrorContains(t, err, "0 rows matched")
	require.Empty(t, b.claim(t, b.now.Add(time.Hour), 10, 10), "a processed receipt is never claimed")
}

// TestLockWaitsForTheHolder: a second worker whose lease expired waits for
// the first one's transaction (it does not skip), and then finds the
// receipt processed.
func TestLockWaitsForTheHolder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.store(t, "evt_1")

	tx, err := b.db.Connect(t).Begin(ctx)
	require.NoError(t, err)
	_, found, err := inbox.Lock(ctx, tx, key("evt_1"))
	require.NoError(t, err)
	require.True(t, found)

	type lockResult struct {
		found bool
		err   error
	}
	done := make(chan lockResult, 1)
	go func() {
		tx2, err := b.db.Pool.Begin(ctx)
		if err != nil {
			done <- lockResult{err: err}
			return
		}
		defer tx2.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // read only
		_, found, err := inbox.Lock(ctx, tx2, key("evt_1"))
		done <- lockResult{found, err}
	}()
	b.db.WaitForLockWaiter(t)
	_, err = inbox.MarkProcessed(ctx, tx, key("evt_1"), "applied", nil)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	got := <-done
	require.NoError(t, got.err)
	require.False(t, got.found, "the waiter sees the holder's commit")
}

// TestRecordFailureBacksOffOrParks: a failure keeps the error and makes
// the receipt claimable after the delay; at the last attempt it waits for
// review outside the claim's range; a processed receipt is left alone.
func TestRecordFailureBacksOffOrParks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.store(t, "evt_retry", "evt_last", "evt_done")
	const maxAttempts = 2
	require.Len(t, b.claim(t, b.now, maxAttempts, 10), 3)

	require.NoError(t, inbox.RecordFailure(ctx, b.db.Pool, key("evt_retry"), "boom", 30*time.Second, &b.now, maxAttempts))
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "event_id = 'evt_retry' AND last_error = 'boom' AND available_at = $1", b.now.Add(30*time.Second)))

	_, err := b.db.Pool.Exec(ctx, "UPDATE webhook_inbox SET attempts = $1 WHERE event_id = 'evt_last'", maxAttempts)
	require.NoError(t, err)
	require.NoError(t, inbox.RecordFailure(ctx, b.db.Pool, key("evt_last"), "boom", 30*time.Second, &b.now, maxAttempts))
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "event_id = 'evt_last' AND available_at = 'infinity'"))

	_, err = inbox.MarkProcessed(ctx, b.db.Pool, key("evt_done"), "applied", nil)
	require.NoError(t, err)
	require.NoError(t, inbox.RecordFailure(ctx, b.db.Pool, key("evt_done"), "late", time.Second, &b.now, maxAttempts))
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "event_id = 'evt_done' AND last_error IS NULL AND outcome = 'applied'"))

	require.Empty(t, b.claim(t, b.now.Add(29*time.Second), maxAttempts, 10), "within the backoff")
	got := b.claim(t, b.now.Add(30*time.Second), maxAttempts, 10)
	require.Len(t, got, 1)
	require.Equal(t, "evt_retry", got[0].EventID)
}

// TestReleaseGivesBackOnlyOwnClaims: a release uncounts the attempt and
// makes the receipt claimable at once, unless another worker has claimed
// it again since (the attempt count fences it).
func TestReleaseGivesBackOnlyOwnClaims(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.store(t, "evt_mine", "evt_taken")
	claims := b.claim(t, b.now, 10, 10)
	require.Len(t, claims, 2)

	// evt_taken's lease expires and another worker claims it (attempt 2).
	_, err := b.db.Pool.Exec(ctx, "UPDATE webhook_inbox SET available_at = $1 WHERE event_id = 'evt_taken'", b.now)
	require.NoError(t, err)
	taken := b.claim(t, b.now, 10, 10)
	require.Len(t, taken, 1)
	require.Equal(t, 2, taken[0].Attempts)

	released, err := inbox.ReleaseKeys(ctx, b.db.Pool, claims, &b.now)
	require.NoError(t, err)
	require.Equal(t, []inbox.Key{key("evt_mine")}, released)
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "event_id = 'evt_mine' AND attempts = 0 AND available_at = $1", b.now))
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "event_id = 'evt_taken' AND attempts = 2 AND available_at > $1", b.now))

	n, err := inbox.Release(ctx, b.db.Pool, claims, &b.now)
	require.NoError(t, err)
	require.Equal(t, 0, n, "released once: the second release finds attempts 0, not its claim's 1")
	again := b.claim(t, b.now, 10, 10)
	require.Len(t, again, 1)
	require.Equal(t, "evt_mine", again[0].EventID)
	require.Equal(t, 1, again[0].Attempts)
}

// TestBatchLockAndMark: LockMany returns only unprocessed receipts, and
// MarkManyProcessed marks each with its outcome in one statement.
func TestBatchLockAndMark(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	keys := b.storeKeys(t, "evt_", 4)
	_, err := inbox.MarkProcessed(ctx, b.db.Pool, keys[0], "applied", nil)
	require.NoError(t, err)

	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // committed below
	locked, err := inbox.LockMany(ctx, tx, keys)
	require.NoError(t, err)
	require.Len(t, locked, 3)
	require.NotContains(t, locked, keys[0], "already processed")
	lat, err := inbox.MarkManyProcessed(ctx, tx, keys[1:], []string{"applied", "ignored", "ignored_other_mode"}, &b.now)
	require.NoError(t, err)
	require.Len(t, lat, 3)
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, 4, b.db.Count(t, "webhook_inbox", "processed_at IS NOT NULL"))
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "event_id = 'evt_3' AND outcome = 'ignored_other_mode'"))

	_, err = inbox.MarkManyProcessed(ctx, b.db.Pool, keys[1:2], []string{"applied"}, nil)
	require.ErrorContains(t, err, "marked 0 of 1 receipts", "marking twice is an error")
}

// TestPipelinedBatchLockAndMark: BeginLockMany opens the transaction and
// locks in one round trip, MarkManyProcessedCommit marks and commits in
// another. A mark that fails (an outcome the table refuses) does not
// commit: the transaction is left failed for the caller to roll back, and
// nothing of it holds; nor does one that would miss a receipt.
func TestPipelinedBatchLockAndMark(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	keys := b.storeKeys(t, "evt_p", 3)
	conn, err := b.db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	status := func() byte { return conn.Conn().PgConn().TxStatus() }

	locked, err := inbox.BeginLockMany(ctx, conn, keys, time.Second, 0)
	require.NoError(t, err)
	require.Len(t, locked, 3)
	require.Equal(t, byte('T'), status())
	_, committed, err := inbox.MarkManyProcessedCommit(ctx, conn, keys[:1], []string{"no such outcome"}, nil)
	require.Error(t, err)
	require.False(t, committed)
	require.Equal(t, byte('E'), status())
	_, err = conn.Exec(ctx, "ROLLBACK")
	require.NoError(t, err)
	require.Zero(t, b.db.Count(t, "webhook_inbox", "processed_at IS NOT NULL"))

	_, err = inbox.BeginLockMany(ctx, conn, keys, time.Second, 100*time.Millisecond)
	require.NoError(t, err)
	lat, committed, err := inbox.MarkManyProcessedCommit(ctx, conn, keys[:2], []string{"applied", "ignored"}, &b.now)
	require.NoError(t, err)
	require.True(t, committed)
	require.Len(t, lat, 2)
	require.Equal(t, byte('I'), status())
	require.Equal(t, 2, b.db.Count(t, "webhook_inbox", "processed_at IS NOT NULL"))

	// keys[1] is processed: the mark misses it, fails, and COMMIT does not
	// run, so keys[2] is not marked either.
	_, err = inbox.BeginLockMany(ctx, conn, keys, time.Second, 0)
	require.NoError(t, err)
	_, committed, err = inbox.MarkManyProcessedCommit(ctx, conn, keys[1:], []string{"applied", "applied"}, nil)
	require.ErrorContains(t, err, "marked 1 of 2 receipts")
	require.False(t, committed)
	require.Equal(t, byte('E'), status())
	_, err = conn.Exec(ctx, "ROLLBACK")
	require.NoError(t, err)
	require.Equal(t, 2, b.db.Count(t, "webhook_inbox", "processed_at IS NOT NULL"))
}
