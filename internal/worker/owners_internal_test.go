package worker

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/inbox"
)

func claimedOf(keys ...string) []inbox.Claimed {
	var out []inbox.Claimed
	for i, k := range keys {
		out = append(out, inbox.Claimed{Key: inbox.Key{EventID: k + "_" + string(rune('a'+i))}, LockKey: k})
	}
	return out
}

func ids(cs []inbox.Claimed) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.EventID)
	}
	return out
}

// TestOwnersHandAnInvoicesReceiptsToTheDrainerApplyingIt: what a drainer
// claims of an invoice another drainer is applying goes to that drainer,
// which gets it when it is done, and gives its invoices up only when
// nothing is left for it; an owner holds at most limit handed receipts; a
// drainer that leaves hands back what it was handed.
func TestOwnersHandAnInvoicesReceiptsToTheDrainerApplyingIt(t *testing.T) {
	o := newOwners(2)
	require.Equal(t, []string{"in_1_a", "in_2_b", "in_1_c"}, ids(o.take(0, claimedOf("in_1", "in_2", "in_1"))))
	// Drainer 1 keeps in_3 and the third receipt of in_1 (drainer 0 holds
	// two handed already, its limit), and hands drainer 0 the others.
	require.Equal(t, []string{"in_3_b", "in_4_d", "in_1_e"}, ids(o.take(1, claimedOf("in_1", "in_3", "in_2", "in_4", "in_1"))))
	require.Empty(t, o.done(1)) // drainer 1 gives up in_3 and in_4
	// Drainer 0 gets what it was handed and keeps in_1 and in_2 meanwhile.
	require.Equal(t, []string{"in_1_a", "in_2_c"}, ids(o.done(0)))
	require.Empty(t, o.take(1, claimedOf("in_2")))
	require.Equal(t, []string{"in_2_a"}, ids(o.done(0)))
	require.Empty(t, o.done(0)) // and gives them up
	require.Equal(t, []string{"in_1_a"}, ids(o.take(1, claimedOf("in_1"))))
	require.Empty(t, o.done(1))

	// A drainer that leaves gives up its invoices and returns what it was
	// handed; the next claim of that invoice is kept by its claimer.
	require.Len(t, o.take(0, claimedOf("in_5")), 1)
	require.Empty(t, o.take(1, claimedOf("in_5")))
	require.Equal(t, []string{"in_5_a"}, ids(o.leave(0)))
	require.Len(t, o.take(1, claimedOf("in_5")), 1)
	require.Empty(t, o.done(1))
	require.Empty(t, o.owner)
	require.Empty(t, o.handed)
	require.Empty(t, o.keys)
}
