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

// lifecycle is one invoice's realistic sequence of live-mode events, the
// test-mode events that come with it on a live endpoint, and the final facts
// they state, which the state must end in whatever the order and however
// often each event arrives.
type lifecycle struct {
	events      []lcEvent // live mode: booked
	otherMode   []lcEvent // test mode: stored and ignored
	finalStatus string
	amountDue   int64    // from the newest invoice snapshot
	ledger      []string // "invoice_id kind amount"
}

type lcEvent struct {
	typ     string
	created int64
	object  map[string]any
}

// refundFact is one refund's history: the statuses it went through, in the
// order Stripe sent them.
type refundFact struct {
	id       string
	amount   int64
	statuses []string
}

// entries are the ledger lines the refund's final facts call for: booked
// if it ever succeeded, and reversed if it then failed or was canceled.
func (f refundFact) entries(inv string) []string {
	if !slices.Contains(f.statuses, "succeeded") {
		return nil
	}
	out := []string{fmt.Sprintf("%s refund:%s %d", inv, f.id, -f.amount)}
	if last := f.statuses[len(f.statuses)-1]; last == "failed" || last == "canceled" {
		out = append(out, fmt.Sprintf("%s refund_reversal:%s %d", inv, f.id, f.amount))
	}
	return out
}

func makeLifecycle(r *rand.Rand, i int) lifecycle {
	inv := fmt.Sprintf("in_%03d", i)
	ch := "ch_" + inv
	amount := int64(100 * (1 + r.IntN(50)))
	var lc lifecycle
	// Invoice snapshots: each later one has a later created and another
	// amount_due, which the invoice must end with.
	step := int64(0)
	ev := func(typ, status string) lcEvent {
		step++
		o := stripetest.Invoice(inv, "cus_"+strconv.Itoa(i), status, amount)
		o["amount_due"] = amount + 10*step
		if status == "paid" && r.IntN(2) == 0 {
			o["charge"] = ch // API versions before basil name the charge
		}
		lc.amountDue = amount + 10*step
		return lcEvent{typ, stripetest.Created + step, o}
	}
	refundEv := func(typ string, f refundFact, status string) lcEvent {
		return lcEvent{typ, stripetest.Created, stripetest.RefundIn(f.id, ch, status, f.amount)}
	}
	// listing is a charge.refunded listing each refund in the status given.
	listing := func(withInvoice bool, refunds map[*refundFact]string) lcEvent {
		var list []map[string]any
		for f, st := range refunds {
			list = append(list, stripetest.RefundIn(f.id, ch, st, f.amount))
		}
		linked := ""
		if withInvoice {
			linked = inv
		}
		return lcEvent{"charge.refunded", stripetest.Created, stripetest.ChargeWithRefundList(ch, linked, list...)}
	}
	refundFacts := func(facts ...refundFact) {
		for _, f := range facts {
			lc.ledger = append(lc.ledger, f.entries(inv)...)
		}
	}
	lc.events = []lcEvent{ev("invoice.created", "draft"), ev("invoice.finalized", "open")}
	payment := func() { lc.ledger = append(lc.ledger, fmt.Sprintf("%s payment %d", inv, amount)) }
	switch r.IntN(6) {
	case 0: // paid, then two refunds that go pending -> succeeded, with
		// charge.refunded listing them as they stand
		re1 := refundFact{"re_" + inv + "_1", 10, []string{"pending", "succeeded"}}
		re2 := refundFact{"re_" + inv + "_2", 20, []string{"pending", "succeeded"}}
		lc.events = append(lc.events, ev("invoice.paid", "paid"),
			refundEv("refund.created", re1, "pending"),
			refundEv("refund.updated", re1, "succeeded"),
			listing(true, map[*refundFact]string{&re1: "succeeded"}),
			refundEv("refund.created", re2, "pending"),
			listing(true, map[*refundFact]string{&re1: "succeeded", &re2: "pending"}),
			refundEv("charge.refund.updated", re2, "succeeded"),
			listing(true, map[*refundFact]string{&re1: "succeeded", &re2: "succeeded"}))
		lc.finalStatus = "paid"
		payment()
		refundFacts(re1, re2)
		// A connected account's test-mode refund of the same ids.
		lc.otherMode = append(lc.otherMode, refundEv("refund.updated", refundFact{"re_" + inv + "_3", 30, nil}, "succeeded"))
	case 1: // paid; one refund succeeds then fails, one is canceled before
		// it succeeds, one fails while pending; a listing shows several
		// statuses at once
		reF := refundFact{"re_" + inv + "_f", 40, []string{"succeeded", "failed"}}
		reC := refundFact{"re_" + inv + "_c", 50, []string{"requires_action", "canceled"}}
		reP := refundFact{"re_" + inv + "_p", 60, []string{"pending", "failed"}}
		lc.events = append(lc.events, ev("invoice.paid", "paid"),
			refundEv("refund.created", reF, "succeeded"),
			refundEv("refund.failed", reF, "failed"),
			refundEv("refund.updated", reF, "failed"),
			refundEv("refund.created", reC, "requires_action"),
			refundEv("refund.updated", reC, "canceled"),
			refundEv("refund.created", reP, "pending"),
			refundEv("refund.failed", reP, "failed"),
			listing(r.IntN(2) == 0, map[*refundFact]string{&reF: "succeeded", &reC: "requires_action", &reP: "pending"}),
			listing(true, map[*refundFact]string{&reF: "failed", &reC: "canceled", &reP: "failed"}))
		lc.finalStatus = "paid"
		payment()
		refundFacts(reF, reC, reP)
		lc.otherMode = append(lc.otherMode, refundEv("refund.updated", reC, "succeeded"))
	case 5: // paid (2025-03-31.basil: invoice_payment.paid links the
		// PaymentIntent only); each refund's first events name only the
		// charge, a later one names the PaymentIntent too
		pi := "pi_" + inv
		withPI := func(e lcEvent) lcEvent { e.object["payment_intent"] = pi; return e }
		reS := refundFact{"re_" + inv + "_s", 70, []string{"pending", "succeeded"}}
		reF := refundFact{"re_" + inv + "_f", 80, []string{"succeeded", "failed"}}
		lc.events = append(lc.events, ev("invoice.paid", "paid"),
			lcEvent{"invoice_payment.paid", stripetest.Created, map[string]any{"id": "inpay_" + inv, "object": "invoice_payment", "invoice": inv,
				"status": "paid", "payment": map[string]any{"type": "payment_intent", "payment_intent": pi}}},
			refundEv("refund.created", reS, "pending"),
			refundEv("charge.refund.updated", reS, "succeeded"),
			withPI(refundEv("refund.updated", reS, "succeeded")),
			refundEv("refund.created", reF, "succeeded"),
			withPI(refundEv("refund.failed", reF, "failed")),
			refundEv("refund.updated", reF, "failed"))
		lc.finalStatus = "paid"
		payment()
		refundFacts(reS, reF)
	case 2:
		lc.events = append(lc.events, ev("invoice.voided", "void"))
		lc.finalStatus = "void"
		// A test-mode payment of the void invoice: booked, it would pay it or
		// raise an anomaly.
		lc.otherMode = append(lc.otherMode, lcEvent{"invoice.paid", stripetest.Created + 99, stripetest.Invoice(inv, "cus_x", "paid", amount)})
	case 3:
		lc.events = append(lc.events, ev("invoice.marked_uncollectible", "uncollectible"), ev("invoice.paid", "paid"))
		lc.finalStatus = "paid"
		payment()
	default:
		lc.events = append(lc.events, ev("invoice.marked_uncollectible", "uncollectible"), ev("invoice.voided", "void"))
		lc.finalStatus = "void"
		lc.otherMode = append(lc.otherMode, lcEvent{"invoice.created", stripetest.Created + 99, stripetest.Invoice(inv+"_test", "cus_x", "draft", amount)})
	}
	return lc
}

// TestAnyOrderAndDuplicatesGiveTheSameResult delivers random mixes of
// several invoices' lifecycles, shuffled, with redeliveries of the same event
// and separate Event objects for the same fact, drained by four concurrent
// drainers, and compares the final state with what each lifecycle must end
// in: the ledger against the events' final facts (payments of paid invoices,
// refunds that succeeded, reversed if they then failed, each under its
// invoice), statuses, the newest snapshot's amount_due, and no effect of the
// test-mode events a live endpoint also receives. Set INBOX_PERMUTATION_SEED
// to replay a failing seed.
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
			wantAmountDue := map[string]int64{}
			otherMode := map[string]bool{} // event ids
			for i := range 12 {
				lc := makeLifecycle(r, i)
				want = append(want, lc.ledger...)
				inv := fmt.Sprintf("in_%03d", i)
				wantStatus[inv] = lc.finalStatus
				wantAmountDue[inv] = lc.amountDue
				deliver := func(id string, e lcEvent, live bool) {
					payload := stripetest.EventWith(id, e.typ, stripetest.Meta{Created: e.created, Livemode: live}, e.object)
					deliveries = append(deliveries, payload)
					for range r.IntN(3) { // redeliveries of the same event
						deliveries = append(deliveries, payload)
					}
					if !live {
						otherMode[id] = true
					}
					if r.IntN(4) == 0 { // the same fact as a separate Event object
						deliveries = append(deliveries, stripetest.EventWith(id+"_twin", e.typ, stripetest.Meta{Created: e.created, Livemode: live}, e.object))
						if !live {
							otherMode[id+"_twin"] = true
						}
					}
				}
				for j, e := range lc.events {
					deliver(fmt.Sprintf("evt_%03d_%d", i, j), e, true)
				}
				for j, e := range lc.otherMode {
					deliver(fmt.Sprintf("evt_%03d_test_%d", i, j), e, false)
				}
			}
			r.Shuffle(len(deliveries), func(i, j int) { deliveries[i], deliveries[j] = deliveries[j], deliveries[i] })
			// Receive in two waves with a drain in between, so that some events
			// are processed before others have even arrived.
			half := len(deliveries) / 2
			w := b.newWorker(t, nil, worker.Config{Mode: worker.ModeLive, Concurrency: 4, ClaimLimit: 3})
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

			// The ledger holds exactly the entries the events' final facts
			// call for: each paid invoice's payment, and each refund that
			// succeeded (reversed if it then failed or was canceled), under
			// its invoice whichever event came first; nothing from test mode.
			slices.Sort(want)
			require.Equal(t, want, b.ledger(t))
			rows, err := b.pool.Query(context.Background(), "SELECT invoice_id, sum(amount) FILTER (WHERE kind <> 'payment') FROM ledger_entries GROUP BY 1")
			require.NoError(t, err)
			gotNet := map[string]int64{}
			for rows.Next() {
				var inv string
				var net *int64
				require.NoError(t, rows.Scan(&inv, &net))
				if net != nil {
					gotNet[inv] = *net
				}
			}
			require.NoError(t, rows.Err())
			wantNet := map[string]int64{}
			for _, e := range want {
				var inv, kind string
				var amount int64
				_, err := fmt.Sscan(e, &inv, &kind, &amount)
				require.NoError(t, err)
				if kind != "payment" {
					wantNet[inv] += amount
				}
			}
			require.Equal(t, wantNet, gotNet, "net refunds per invoice")

			require.Equal(t, len(otherMode), b.db.Count(t, "webhook_inbox", "outcome = 'ignored_other_mode'"))
			require.Equal(t, len(otherMode), b.db.Count(t, "webhook_inbox", "NOT livemode"))
			require.Equal(t, 0, b.db.Count(t, "invoices", "id LIKE '%_test'"))
			require.Equal(t, 0, b.db.Count(t, "refunds", "id LIKE '%_3'"), "test-mode refunds are not even recorded")
			for inv, due := range wantAmountDue {
				var got int64
				require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT amount_due FROM invoices WHERE id = $1", inv).Scan(&got))
				require.Equal(t, due, got, "%s: amount_due of the newest snapshot", inv)
			}
			for inv, status := range wantStatus {
				require.Equal(t, status, b.invoiceStatus(t, inv), inv)
			}
			require.Equal(t, 0, b.db.Count(t, "anomalies", ""))
			require.Equal(t, countPaid(wantStatus), b.db.Count(t, "outbox", ""), "one notification per paid invoice")
		})
	}
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
