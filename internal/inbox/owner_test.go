package inbox

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/pgtest"

	"github.com/stripe-inbox/inbox/migrations"
)

// TestOwnerKeyIsTheIndexExpression: the claim's ownerKey is the expression
// of the index webhook_inbox_owner (migrations/0022_claim_owner.sql), or
// PostgreSQL would not use the index to find a claim's mates.
func TestOwnerKeyIsTheIndexExpression(t *testing.T) {
	t.Parallel()
	b, err := migrations.FS.ReadFile("0022_claim_owner.sql")
	require.NoError(t, err)
	squash := func(s string) string { return strings.Join(strings.Fields(s), " ") }
	require.Contains(t, squash(string(b)), "ON webhook_inbox ("+squash(ownerKey)+") WHERE processed_at IS NULL")
}

// insertLifecycles stores, for each of n invoices in_<prefix><i>, the
// events that name it: invoice.created, invoice.finalized and invoice.paid
// (the invoice is the object), invoice_payment.paid (its invoice field) and
// charge.refunded of ch_<prefix><i> (pre-basil: its invoice field), and a
// refund.created of that charge, owned by the charge. It returns each
// event's owner.
func insertLifecycles(t *testing.T, db *pgtest.Database, prefix string, n int) map[string]string {
	t.Helper()
	owners := map[string]string{}
	b := &pgx.Batch{}
	const q = `INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, object_id, payload)
		VALUES ('stripe', 'billing', $1, $2, false, $3, jsonb_build_object('id', $1::text, 'type', $2::text, 'data', jsonb_build_object('object', $4::jsonb)))`
	for i := range n {
		in, ch := fmt.Sprintf("in_%s%d", prefix, i), fmt.Sprintf("ch_%s%d", prefix, i)
		add := func(typ, object, owner string, obj map[string]any) {
			id := fmt.Sprintf("evt_%s%d_%s", prefix, i, typ)
			owners[id] = owner
			js, err := json.Marshal(obj)
			require.NoError(t, err)
			b.Queue(q, id, typ, object, string(js))
		}
		add("invoice.created", in, in, map[string]any{"id": in, "object": "invoice"})
		add("invoice.finalized", in, in, map[string]any{"id": in, "object": "invoice"})
		add("invoice.paid", in, in, map[string]any{"id": in, "object": "invoice", "charge": ch})
		add("invoice_payment.paid", "inpay_"+in, in, map[string]any{"id": "inpay_" + in, "object": "invoice_payment", "invoice": in})
		add("charge.refunded", ch, in, map[string]any{"id": ch, "object": "charge", "invoice": map[string]any{"id": in, "object": "invoice"}})
		add("refund.created", "re_"+ch, ch, map[string]any{"id": "re_" + ch, "object": "refund", "charge": ch})
	}
	require.NoError(t, db.Pool.SendBatch(context.Background(), b).Close())
	return owners
}

// TestClaimTakesTheOwnersOtherEvents: a claim takes, with each receipt it
// picks, the other claimable receipts of its owner (the invoice its payload names),
// found through the index webhook_inbox_owner, and leaves other owners'
// receipts and its owner's receipts that are not claimable (leased).
func TestClaimTakesTheOwnersOtherEvents(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	ctx := context.Background()
	owners := insertLifecycles(t, db, "a", 200)
	_, err := db.Pool.Exec(ctx, "ANALYZE webhook_inbox")
	require.NoError(t, err)

	out, err := ExplainClaim(ctx, db.Connect(t), ClaimParams{MaxAttempts: 10, Limit: 1, Lease: time.Minute}, "TEXT")
	require.NoError(t, err)
	require.Contains(t, out, "webhook_inbox_owner", "the claim finds the mates through the index:\n%s", out)

	t.Logf("%s", out)

	// Owners of 5 receipts (an invoice's) and of 1 (a refund's charge): a
	// claim of up to 6 takes whole owners, in the order it picked them.
	claimed, err := Claim(ctx, db.Pool, ClaimParams{MaxAttempts: 10, Limit: 6, Lease: time.Minute})
	require.NoError(t, err)
	require.NotEmpty(t, claimed)
	require.LessOrEqual(t, len(claimed), 6, "never more than the limit")
	got := map[string][]string{}
	for _, c := range claimed {
		got[owners[c.EventID]] = append(got[owners[c.EventID]], c.EventID)
	}
	five := false
	for owner, ids := range got {
		var want []string
		for id, o := range owners {
			if o == owner {
				want = append(want, id)
			}
		}
		require.ElementsMatch(t, want, ids, "every receipt of owner %s", owner)
		five = five || len(ids) == 5
	}
	require.True(t, five, "an invoice's five receipts, one picked and four mates: %v", claimed)
}

// TestConcurrentClaimsNeverShareAnOwner: eight connections claim at once,
// again and again, from a backlog of invoice lifecycles, until nothing is
// left. Every receipt is claimed exactly once, and no owner's receipts are
// split between two claims: a claim picks only owners no concurrent claim
// holds (its advisory locks), and takes all of their claimable receipts.
func TestConcurrentClaimsNeverShareAnOwner(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	ctx := context.Background()
	owners := insertLifecycles(t, db, "c", 300)
	var (
		mu     sync.Mutex
		claims [][]Claimed
		wg     sync.WaitGroup
		start  = make(chan struct{})
	)
	for range 8 {
		conn := db.Connect(t) // a connection each: real concurrent claims
		wg.Go(func() {
			<-start
			for {
				c, err := Claim(ctx, conn, ClaimParams{MaxAttempts: 10, Limit: 6, Lease: time.Hour})
				if !assert.NoError(t, err) || len(c) == 0 {
					return
				}
				mu.Lock()
				claims = append(claims, c)
				mu.Unlock()
			}
		})
	}
	close(start)
	wg.Wait()

	claimedBy := map[string]int{} // owner -> claim
	seen := map[string]bool{}
	for i, c := range claims {
		for _, r := range c {
			require.False(t, seen[r.EventID], "%s claimed twice", r.EventID)
			seen[r.EventID] = true
			o := owners[r.EventID]
			if j, ok := claimedBy[o]; ok && j != i {
				t.Fatalf("owner %s in claims %d and %d: %v / %v", o, j, i, claims[j], c)
			}
			claimedBy[o] = i
		}
	}
	require.Len(t, seen, len(owners), "every receipt claimed")
}
