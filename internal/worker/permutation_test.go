package worker_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/stripetest"
	"github.com/stripe-inbox/inbox/internal/worker"
)

// lifecycle is one invoice's realistic sequence of events and the state it
// must end in, whatever the order and however often each event arrives.
type lifecycle struct {
	events      []lcEvent
	finalStatus string
	ledger      []string // "invoice_id kind amount"
}

type lcEvent struct {
	typ    string
	object map[string]any
}

func makeLifecycle(r *rand.Rand, i int) lifecycle {
	inv := fmt.Sprintf("in_%03d", i)
	amount := int64(100 * (1 + r.IntN(50)))
	ev := func(typ, status string) lcEvent {
		return lcEvent{typ, stripetest.Invoice(inv, "cus_"+strconv.Itoa(i), status, amount)}
	}
	base := []lcEvent{ev("invoice.created", "draft"), ev("invoice.finalized", "open")}
	payment := fmt.Sprintf("%s payment %d", inv, amount)
	switch r.IntN(4) {
	case 0: // paid, then partly refunded twice
		ch := "ch_" + inv
		re1, re2 := "re_"+inv+"_1", "re_"+inv+"_2"
		return lifecycle{
			events: append(base, ev("invoice.paid", "paid"),
				lcEvent{"charge.refunded", stripetest.ChargeWithRefunds(ch, inv, map[string]int64{re1: 10})},
				lcEvent{"charge.refunded", stripetest.ChargeWithRefunds(ch, inv, map[string]int64{re1: 10, re2: 20})},
				lcEvent{"refund.created", stripetest.Refund(re2, ch, 20)}),
			finalStatus: "paid",
			ledger:      []string{payment, inv + " refund:" + re1 + " -10", inv + " refund:" + re2 + " -20"},
		}
	case 1:
		return lifecycle{events: append(base, ev("invoice.voided", "void")), finalStatus: "void"}
	case 2:
		return lifecycle{events: append(base, ev("invoice.marked_uncollectible", "uncollectible"), ev("invoice.paid", "paid")),
			finalStatus: "paid", ledger: []string{payment}}
	default:
		return lifecycle{events: append(base, ev("invoice.marked_uncollectible", "uncollectible"), ev("invoice.voided", "void")),
			finalStatus: "void"}
	}
}

// TestAnyOrderAndDuplicatesGiveTheSameResult delivers random mixes of
// several invoices' lifecycles, shuffled, with redeliveries of the same event
// and separate Event objects for the same fact, drained by four concurrent
// drainers, and compares the final state with what each lifecycle must end
// in. Set INBOX_PERMUTATION_SEED to replay a failing seed.
func TestAnyOrderAndDuplicatesGiveTheSameResult(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("INBOX_PERMUTATION_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		require.NoError(t, err)
		seed = v
	}
	for round := range 4 {
		roundSeed := seed + uint64(round)
		t.Run(fmt.Sprintf("seed=%d", roundSeed), func(t *testing.T) {
			t.Parallel()
			t.Logf("replay with INBOX_PERMUTATION_SEED=%d", roundSeed)
			r := rand.New(rand.NewPCG(roundSeed, 0))
			b := setup(t)

			var deliveries [][]byte
			var want []string
			wantStatus := map[string]string{}
			for i := range 12 {
				lc := makeLifecycle(r, i)
				want = append(want, lc.ledger...)
				wantStatus[fmt.Sprintf("in_%03d", i)] = lc.finalStatus
				for j, e := range lc.events {
					id := fmt.Sprintf("evt_%03d_%d", i, j)
					payload := stripetest.Event(id, e.typ, e.object)
					deliveries = append(deliveries, payload)
					for range r.IntN(3) { // redeliveries of the same event
						deliveries = append(deliveries, payload)
					}
					if r.IntN(4) == 0 { // the same fact as a separate Event object
						deliveries = append(deliveries, stripetest.Event(id+"_twin", e.typ, e.object))
					}
				}
			}
			r.Shuffle(len(deliveries), func(i, j int) { deliveries[i], deliveries[j] = deliveries[j], deliveries[i] })
			// Receive in two waves with a drain in between, so that some events
			// are processed before others have even arrived.
			half := len(deliveries) / 2
			w := b.newWorker(t, nil, worker.Config{Concurrency: 4, ClaimLimit: 3})
			for _, d := range deliveries[:half] {
				b.receive(t, d)
			}
			b.run(t, w)
			for _, d := range deliveries[half:] {
				b.receive(t, d)
			}
			s := b.run(t, w)
			failed := s.Failed
			// In batches, two transactions can deadlock across event types
			// (see ProcessBatch); the receipt is retried after its backoff.
			for round := 0; s.Remaining > 0 && round < 5; round++ {
				w.Now = at(time.Now().UTC().Add(time.Duration(round+1) * time.Hour))
				s = b.run(t, w)
				failed += s.Failed
			}
			require.Equal(t, 0, s.Remaining)
			if testBatchSize(t) == 1 {
				require.Equal(t, 0, failed, "one receipt per transaction never deadlocks")
			}
			require.Equal(t, 0, b.db.Count(t, "webhook_inbox", "processed_at IS NULL"))

			rows, err := b.pool.Query(context.Background(), "SELECT invoice_id || ' ' || kind || ' ' || amount FROM ledger_entries")
			require.NoError(t, err)
			var got []string
			for rows.Next() {
				var s string
				require.NoError(t, rows.Scan(&s))
				got = append(got, s)
			}
			require.NoError(t, rows.Err())
			slices.Sort(got)
			slices.Sort(want)
			// refund.created books against the charge, charge.refunded against the
			// invoice; whichever came first wins. Compare kind and amount.
			require.Equal(t, normalize(want), normalize(got))

			for inv, status := range wantStatus {
				require.Equal(t, status, b.invoiceStatus(t, inv), inv)
			}
			require.Equal(t, 0, b.db.Count(t, "anomalies", ""))
			require.Equal(t, countPaid(wantStatus), b.db.Count(t, "outbox", ""), "one notification per paid invoice")
		})
	}
}

func normalize(entries []string) []string {
	out := make([]string, len(entries))
	for i, e := range entries {
		var inv, kind, amount string
		fmt.Sscan(e, &inv, &kind, &amount)
		if len(kind) > 7 && kind[:7] == "refund:" {
			inv = "*"
		}
		out[i] = inv + " " + kind + " " + amount
	}
	slices.Sort(out)
	return out
}

func countPaid(m map[string]string) int {
	n := 0
	for _, s := range m {
		if s == "paid" {
			n++
		}
	}
	return n
}
