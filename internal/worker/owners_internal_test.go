package worker

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
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

	// A receipt claimed again (its lease ended while it waited) replaces
	// the copy its owner holds: the newer claim is the fencing token.
	o.take(0, claimedOf("in_6"))
	again := claimedOf("in_6", "in_6")
	again[1].Key = again[0].Key
	again[0].Attempts, again[1].Attempts = 1, 2
	require.Empty(t, o.take(1, again[:1]))
	require.Empty(t, o.done(1))
	require.Empty(t, o.take(1, again[1:]))
	require.Empty(t, o.done(1))
	h := o.done(0)
	require.Len(t, h, 1)
	require.Equal(t, 2, h[0].Attempts)
	require.Empty(t, o.done(0))

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

// TestOwnersUnderConcurrentDrainers: drainers that take, apply and finish
// at once (run with -race) apply every receipt exactly once; when owners
// always have room, never two of them one invoice at the same time.
func TestOwnersUnderConcurrentDrainers(t *testing.T) {
	for _, limit := range []int{2, 1 << 20} {
		t.Run(fmt.Sprint("limit ", limit), func(t *testing.T) {
			overlaps := concurrentDrainers(t, newOwners(limit))
			if limit > 2 {
				require.Zero(t, overlaps, "receipts applied while another drainer applied their invoice")
			}
		})
	}
}

// concurrentDrainers runs drainers on o and returns how many receipts were
// applied while another drainer applied their invoice.
func concurrentDrainers(t *testing.T, o *owners) int {
	const drainers, claims, perClaim, invoices = 8, 200, 5, 12
	var (
		mu       sync.Mutex
		applying = map[string]int{} // invoice -> drainers applying it now
		applied  = map[inbox.Key]int{}
		overlaps int
		wg       sync.WaitGroup
	)
	apply := func(id int, list []inbox.Claimed) {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range list {
			applied[c.Key]++
		}
	}
	for id := range drainers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(id), 7))
			// As drain does: what was handed is applied with the next claim.
			var carry []inbox.Claimed
			for n := 0; n < claims || len(carry) > 0; n++ {
				var claimed []inbox.Claimed
				for k := range perClaim * min(1, claims-n) {
					inv := fmt.Sprintf("in_%d", r.IntN(invoices))
					claimed = append(claimed, inbox.Claimed{Key: inbox.Key{EventID: fmt.Sprintf("evt_%d_%d_%d", id, n, k)}, LockKey: inv})
				}
				mine := append(carry, o.take(id, claimed)...)
				mu.Lock()
				for _, inv := range lockKeys(mine) {
					applying[inv]++
					if applying[inv] > 1 {
						overlaps++ // only when an owner had no room
					}
				}
				mu.Unlock()
				runtime.Gosched()
				apply(id, mine)
				mu.Lock()
				for _, inv := range lockKeys(mine) {
					applying[inv]--
				}
				mu.Unlock()
				carry = o.done(id)
			}
		}()
	}
	wg.Wait()
	require.Len(t, applied, drainers*claims*perClaim)
	for k, n := range applied {
		require.Equal(t, 1, n, k.EventID)
	}
	require.Empty(t, o.owner)
	require.Empty(t, o.handed)
	require.Empty(t, o.keys)
	return overlaps
}

func lockKeys(cs []inbox.Claimed) []string {
	var out []string
	for _, c := range cs {
		if !slices.Contains(out, c.LockKey) {
			out = append(out, c.LockKey)
		}
	}
	return out
}

// A receipt's interleave key (internal/batch) is its invoice when the
// claim placed it on one, else none: receipts the claim could not place
// interleave with no other.
func TestInterleaveKeyIsTheInvoiceOrNone(t *testing.T) {
	for lockKey, want := range map[string]string{"in_1": "in_1", "ch_1": "", "pi_1": "", "re_1": "", "": ""} {
		if got := interleaveKey(inbox.Claimed{LockKey: lockKey}); got != want {
			t.Errorf("interleaveKey(LockKey %q) = %q, want %q", lockKey, got, want)
		}
	}
}
