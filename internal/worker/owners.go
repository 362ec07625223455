package worker

import (
	"sync"

	"github.com/stripe-inbox/inbox/internal/inbox"
)

// owners gives each invoice (a receipt's Claimed.LockKey) to one drainer of
// a round at a time (issue 24). Drainers claim the oldest receipts, so two
// of them often hold receipts of one invoice: then both batches lock that
// invoice's rows (the invoice, its payment links, refunds, ledger entries),
// and the later one waits for the earlier one's commit while it holds the
// locks it already took, which others then wait for in turn. With refunds
// in the backlog that convoy took most of what batching gains.
//
// A drainer that claims a receipt of an invoice another drainer is applying
// hands the receipt to that drainer instead (take), which applies it with
// its next claim (done): the receipts of one invoice are applied one
// batch after another, and no drainer of the round waits for another's
// locks on the same invoice. Nothing waits in memory: a drainer never
// blocks on another.
//
// A handed receipt keeps the lease and the counted attempt of the claim
// that took it. It is in one place at a time (the drainer that claimed it,
// or the one it was handed to), and a drainer that stops at the deadline
// margin gives back what was handed to it with what it had not started
// (leave). A drainer holds at most limit (CLAIM_LIMIT) handed receipts: it
// applies them in the batches of its next claim, which asks for that many
// fewer, as if it had claimed them (a handed receipt or two in a batch of
// their own would cost a commit each). A receipt whose owner has no room for it is applied by the
// drainer that claimed it, waiting on the database's locks as before.
//
// The trade-off: the lease covers a claim's receipts (Config.Validate:
// LEASE >= CLAIM_LIMIT x STATEMENT_TIMEOUT, each receipt taking at most
// the statement timeout), and a handed receipt may wait for its owner's
// current list before its own: up to twice that in the worst case, when
// every receipt ahead of it runs to the statement timeout. Its lease can
// then end before it starts; another drainer may claim it again (a second
// attempt counted), and it is still applied once.
//
// This is an optimisation, never a guarantee. Drainers of another process
// (an overlapping invocation) still wait on the database's locks, and what
// makes every receipt apply once is the processing transaction's lock and
// re-check (apply.go).
type owners struct {
	limit int // the most receipts a drainer holds handed

	mu     sync.Mutex
	owner  map[string]int              // LockKey -> the drainer applying it
	handed map[int][]inbox.Claimed     // receipts handed to a drainer, in order
	keys   map[int]map[string]struct{} // the LockKeys each drainer owns
}

func newOwners(limit int) *owners {
	return &owners{limit: limit, owner: map[string]int{}, handed: map[int][]inbox.Claimed{}, keys: map[int]map[string]struct{}{}}
}

// take is called by drainer id with the receipts it claimed. It returns
// the receipts id applies now: those of invoices no other drainer is
// applying (id owns them from now on, if it did not already), and those
// whose owner has no room. The others are handed to their owners.
func (o *owners) take(id int, claimed []inbox.Claimed) []inbox.Claimed {
	o.mu.Lock()
	defer o.mu.Unlock()
	var mine []inbox.Claimed
	for _, c := range claimed {
		by, owned := o.owner[c.LockKey]
		switch {
		case !owned:
			o.owner[c.LockKey] = id
			if o.keys[id] == nil {
				o.keys[id] = map[string]struct{}{}
			}
			o.keys[id][c.LockKey] = struct{}{}
		case by != id && o.hand(by, c):
			continue
		}
		mine = append(mine, c)
	}
	return mine
}

// hand gives c to drainer by, unless by holds limit receipts already. A
// receipt by holds already (claimed again after its lease ended while it
// waited) is replaced by the newer claim, whose attempt count and lease
// are the current fencing token (inbox.Release): one receipt never appears
// twice in a list, so never twice in one batch.
func (o *owners) hand(by int, c inbox.Claimed) bool {
	h := o.handed[by]
	for i := range h {
		if h[i].Key == c.Key {
			h[i] = c
			return true
		}
	}
	if len(h) >= o.limit {
		return false
	}
	o.handed[by] = append(h, c)
	return true
}

// done is called by drainer id when it has applied what it took. It
// returns the receipts handed to id meanwhile, which id applies with its
// next claim, keeping its invoices until then; when there are none, id
// gives up its invoices and done returns nil.
func (o *owners) done(id int) []inbox.Claimed {
	o.mu.Lock()
	defer o.mu.Unlock()
	h := o.handed[id]
	delete(o.handed, id)
	if len(h) == 0 {
		o.release(id)
	}
	return h
}

// leave is called by drainer id when it stops before done returned nil (the
// deadline margin): it gives up id's invoices and returns what was handed
// to id, which the caller gives back (inbox.Release) with what it had not
// started. Nothing is handed to id afterwards: it owns nothing.
func (o *owners) leave(id int) []inbox.Claimed {
	o.mu.Lock()
	defer o.mu.Unlock()
	h := o.handed[id]
	delete(o.handed, id)
	o.release(id)
	return h
}

func (o *owners) release(id int) {
	for k := range o.keys[id] {
		delete(o.owner, k)
	}
	delete(o.keys, id)
}
