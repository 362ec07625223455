package ops_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/ops"
	"github.com/stripe-inbox/inbox/internal/ops/opstest"
	"github.com/stripe-inbox/inbox/internal/stripeevent"
	"github.com/stripe-inbox/inbox/internal/stripetest"
)

// storeHeld stores a receipt of its own (an invoice.created), with the given
// attempts, due since ten minutes ago.
func (b testBundle) storeHeld(t *testing.T, id string, attempts int) {
	t.Helper()
	ctx := context.Background()
	ev, err := stripeevent.Parse(stripetest.Event(id, "invoice.created", stripetest.Invoice("in_"+id, "cus_fx", "draft", 100)))
	require.NoError(t, err)
	_, err = inbox.Store(ctx, b.fx.DB.Pool, "billing", ev)
	require.NoError(t, err)
	_, err = b.fx.DB.Pool.Exec(ctx, "UPDATE webhook_inbox SET attempts = $2, available_at = now() - interval '10 minutes' WHERE event_id = $1", id, attempts)
	require.NoError(t, err)
}

// workerClaim claims, on a connection of its own as a worker does, every
// due receipt, and returns the claim of id.
func workerClaim(t *testing.T, conn *pgx.Conn, id string, now *time.Time) (inbox.Claimed, []inbox.Claimed) {
	t.Helper()
	all, err := inbox.Claim(context.Background(), conn, inbox.ClaimParams{Now: now, MaxAttempts: opstest.MaxAttempts, Limit: 100, Lease: time.Minute})
	require.NoError(t, err)
	for _, c := range all {
		if c.EventID == id {
			return c, all
		}
	}
	t.Fatalf("the worker did not claim %s: %+v", id, all)
	return inbox.Claimed{}, nil
}

// TestRetrySkipsAReceiptAWorkerHolds (issue 23): a worker claims a receipt,
// an operator retries it while the worker holds it, and the worker then
// gives it back unattempted. The retry skips it and names it with the
// lease's end; no other worker can claim it in the meantime; the worker's
// give-back releases its own claim; a retry after that resets it.
func TestRetrySkipsAReceiptAWorkerHolds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.storeHeld(t, "evt_held", 3)
	workerA, workerB := b.fx.DB.Connect(t), b.fx.DB.Connect(t)
	claim, all := workerClaim(t, workerA, "evt_held", nil)
	require.Equal(t, 4, claim.Attempts)

	for _, dry := range []bool{true, false} {
		res := b.do(t, ops.Request{Command: ops.CmdRetry, EventID: "evt_held", DryRun: dry, Reason: "handler fixed"}).Retry
		require.Zero(t, res.Count, "dry run %v", dry)
		require.Empty(t, res.Receipts)
		require.Equal(t, 1, res.SkippedCount)
		require.Equal(t, []ops.SkippedKey{{Endpoint: "billing", EventID: "evt_held", Until: claim.LeaseUntil.UTC()}}, res.Skipped)
	}
	require.Equal(t, 1, b.fx.DB.Count(t, "ops_audit", "action = 'retry' AND affected = 0"), "the retry that changed nothing is audited")
	require.Equal(t, 1, b.fx.DB.Count(t, "webhook_inbox", "event_id = 'evt_held' AND attempts = 4 AND available_at = $1", claim.LeaseUntil))
	other, err := inbox.Claim(ctx, workerB, inbox.ClaimParams{MaxAttempts: opstest.MaxAttempts, Limit: 100, Lease: time.Minute})
	require.NoError(t, err)
	for _, c := range other {
		require.NotEqual(t, "evt_held", c.EventID, "no second worker claims a held receipt")
	}

	// The worker gives back what it did not attempt: its own claim.
	released, err := inbox.ReleaseKeys(ctx, workerA, all, nil)
	require.NoError(t, err)
	require.Contains(t, released, claim.Key)
	require.Equal(t, 1, b.fx.DB.Count(t, "webhook_inbox", "event_id = 'evt_held' AND attempts = 3 AND available_at <= now()"))

	// Now nobody holds it: the retry resets it.
	res := b.do(t, ops.Request{Command: ops.CmdRetry, EventID: "evt_held", Reason: "handler fixed"}).Retry
	require.Equal(t, 1, res.Count)
	require.Zero(t, res.SkippedCount)
	require.Equal(t, 1, b.fx.DB.Count(t, "webhook_inbox", "event_id = 'evt_held' AND attempts = 0"))
}

// TestRetrySkipsALastAttemptAWorkerHolds: a worker claims a receipt's last
// attempt (it is then counted as needing review), an operator retries the
// receipts needing review, and the worker finishes: it books the receipt.
// The retry skipped it (its claim is leased like any other), so the booking
// is the only outcome, and the report named it; the needs-review receipt no
// worker held was retried.
func TestRetrySkipsALastAttemptAWorkerHolds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.storeHeld(t, "evt_last", opstest.MaxAttempts-1)
	worker := b.fx.DB.Connect(t)
	claim, _ := workerClaim(t, worker, "evt_last", nil)
	require.Equal(t, opstest.MaxAttempts, claim.Attempts)

	res := b.do(t, ops.Request{Command: ops.CmdRetry, Filter: ops.Filter{State: "needs-review"}, Reason: "handler fixed"}).Retry
	require.Equal(t, []ops.ReceiptKey{{Endpoint: "billing", EventID: opstest.NeedsReview}}, res.Receipts)
	require.Equal(t, []ops.SkippedKey{{Endpoint: "billing", EventID: "evt_last", Until: claim.LeaseUntil.UTC()}}, res.Skipped)

	// The worker finishes: lock, book, mark, one transaction.
	tx, err := worker.Begin(ctx)
	require.NoError(t, err)
	_, found, err := inbox.Lock(ctx, tx, claim.Key)
	require.NoError(t, err)
	require.True(t, found)
	_, err = inbox.MarkProcessed(ctx, tx, claim.Key, "applied", nil)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, 1, b.fx.DB.Count(t, "webhook_inbox", "event_id = 'evt_last' AND outcome = 'applied' AND attempts = $1", opstest.MaxAttempts))

	b.mistake(t, ops.Request{Command: ops.CmdRetry, EventID: "evt_last", Reason: "x"}, ops.KindConflict, "is processed")
}

// TestReleaseAfterARetryNeverGivesBackAnotherWorkersClaim: a worker outlives
// its claim's lease (the Lambda froze, say). The receipt is no longer held,
// so an operator's retry resets its attempts, and a second worker claims it,
// counting the same attempt as the first worker's claim did. The first
// worker's give-back must leave the second worker's claim alone: the lease
// end the claim returned fences it, with the attempt count.
func TestReleaseAfterARetryNeverGivesBackAnotherWorkersClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.storeHeld(t, "evt_late", 0)
	workerA, workerB := b.fx.DB.Connect(t), b.fx.DB.Connect(t)
	past := time.Now().Add(-90 * time.Second) // A's one-minute lease ended 30 s ago
	claimA, allA := workerClaim(t, workerA, "evt_late", &past)
	require.Equal(t, 1, claimA.Attempts)
	require.True(t, claimA.LeaseUntil.Before(time.Now()), "the first worker's lease has ended")

	res := b.do(t, ops.Request{Command: ops.CmdRetry, EventID: "evt_late", Reason: "stuck"}).Retry
	require.Equal(t, 1, res.Count, "a lease that ended holds nothing")
	claimB, _ := workerClaim(t, workerB, "evt_late", nil)
	require.Equal(t, claimA.Attempts, claimB.Attempts, "the same attempt count as the first claim")

	released, err := inbox.ReleaseKeys(ctx, workerA, allA, nil)
	require.NoError(t, err)
	require.NotContains(t, released, claimA.Key, "the first worker's give-back leaves the second worker's claim alone")
	require.Equal(t, 1, b.fx.DB.Count(t, "webhook_inbox", "event_id = 'evt_late' AND attempts = 1 AND available_at = $1", claimB.LeaseUntil))
	res = b.do(t, ops.Request{Command: ops.CmdRetry, EventID: "evt_late", Reason: "again"}).Retry
	require.Zero(t, res.Count)
	require.Equal(t, "evt_late", res.Skipped[0].EventID, "the second worker holds it")
}
