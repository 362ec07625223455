package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/stripe-inbox/inbox/internal/handlers"
)

// The sample write-back (WRITEBACKS=customer_metadata, docs/writebacks.md):
// the invoice.paid statement records one intent per payment it books on the
// platform's own invoice with a customer (internal/handlers payInvoice), under
// the key handlers.CustomerMetadataKey(invoice); the workers' sender sends it
// to the Stripe API stand-in (scripts/stripeapistandin), which counts the
// requests it ran per key.
const (
	// $1 the run's key prefix.
	selectRunIntents = `
SELECT idempotency_key, target, status, coalesce(result_via, ''), coalesce(result_id, ''), attempts
  FROM writeback_intents WHERE starts_with(idempotency_key, $1)`
	// $1 the run's key prefix.
	countPendingIntents = `SELECT count(*) FROM writeback_intents WHERE starts_with(idempotency_key, $1) AND status = 'pending'`

	// standinAppliedPath is scripts/stripeapistandin's list of what it
	// applied.
	standinAppliedPath = "/_standin/applied"
)

// intentRow is one writeback_intents row of the run.
type intentRow struct {
	Key, Target, Status, Via, ResultID string
	Attempts                           int
}

// appliedKey is what the stand-in did with one Idempotency-Key.
type appliedKey struct {
	Key      string `json:"key"`
	Customer string `json:"customer"`
	Applied  int    `json:"applied"`  // requests that ran
	Replayed int    `json:"replayed"` // requests answered from the saved result
}

// writebacks is the write-back check's result.
type writebacks struct {
	Expected    int // payments booked that must have an intent
	Intents     int // intents of the run
	Done        int // intents recorded as sent (result recorded)
	Superseded  int // of which recorded without a call: a newer intent for the customer was sent first
	Reattempted int // intents claimed more than once (a kill, a fault, a 429)
	Applied     int // requests the stand-in ran for the run's keys
	Replayed    int // requests the stand-in answered from a saved result
	Missing     int // payments without an intent, or whose intent is recorded as sent but the stand-in never ran
	Unsent      int // intents not recorded as sent (pending or parked) when the check gave up waiting
	Doubled     int // requests run beyond one per key, and intents or applied keys for no payment of the run
	Wrong       int // intents for another customer, results naming another customer, requests to another customer
}

func (w writebacks) failed() bool { return w.Missing+w.Unsent+w.Doubled+w.Wrong > 0 }

func (w writebacks) figures() string {
	return fmt.Sprintf("writeback_expected=%d writeback_intents=%d writeback_done=%d writeback_superseded=%d writeback_reattempted=%d writeback_applied=%d writeback_replayed=%d writeback_missing=%d writeback_unsent=%d writeback_doubled=%d writeback_wrong=%d",
		w.Expected, w.Intents, w.Done, w.Superseded, w.Reattempted, w.Applied, w.Replayed, w.Missing, w.Unsent, w.Doubled, w.Wrong)
}

// judgeWritebacks compares the run's intents and what the stand-in applied
// with the payments the run booked (invoice -> customer):
//
//   - each payment has exactly one intent, for its customer, recorded as
//     sent (done) with the customer's id as the result;
//   - the stand-in ran exactly one request under the intent's key, to that
//     customer: replays of the key (a retry after an ambiguous failure or a
//     kill between the call and the record) are counted, not failures; a
//     second request that ran is a double write-back;
//   - an intent recorded as superseded (a newer intent for the same
//     customer was sent first, so sending this one would put the older
//     value back) may have run once (before the newer one was recorded) or
//     never, never twice;
//   - no intent and no applied key for anything else of the run.
func judgeWritebacks(payments map[string]string, intents []intentRow, applied []appliedKey) writebacks {
	w := writebacks{Expected: len(payments), Intents: len(intents)}
	byKey := map[string]appliedKey{}
	for _, a := range applied {
		byKey[a.Key] = a
		w.Applied += a.Applied
		w.Replayed += a.Replayed
	}
	want := map[string]string{} // key -> customer
	for inv, cus := range payments {
		want[handlers.CustomerMetadataKey(inv)] = cus
	}
	seen := map[string]bool{}
	for _, in := range intents {
		cus, ok := want[in.Key]
		if !ok || seen[in.Key] {
			w.Doubled++ // an intent for no payment of the run (or the key twice, which UNIQUE forbids)
			continue
		}
		seen[in.Key] = true
		if in.Attempts > 1 {
			w.Reattempted++
		}
		if in.Target != cus {
			w.Wrong++
			continue
		}
		a := byKey[in.Key]
		if a.Applied > 0 && a.Customer != cus {
			w.Wrong++
		}
		if a.Applied > 1 {
			w.Doubled += a.Applied - 1
		}
		if in.Status != "done" {
			w.Unsent++
			continue
		}
		w.Done++
		if in.ResultID != cus {
			w.Wrong++
		}
		switch in.Via {
		case "superseded":
			w.Superseded++
		default: // call, read_back: the effect is there, by exactly one request
			if a.Applied == 0 {
				w.Missing++
			}
		}
	}
	for key := range want {
		if !seen[key] {
			w.Missing++
		}
	}
	for _, a := range applied {
		if _, ok := want[a.Key]; !ok && a.Applied > 0 {
			w.Doubled += a.Applied // a write-back of the run that no payment asked for
		}
	}
	return w
}

// paidCustomers maps each invoice the run pays through Stripe to its
// customer, read from the generated events (the invoice objects they carry).
func paidCustomers(evs []event, paid map[string]int64) (map[string]string, error) {
	out := map[string]string{}
	for _, ev := range evs {
		if !strings.HasPrefix(ev.Type, "invoice.") {
			continue
		}
		var e struct {
			Data struct {
				Object struct {
					ID       string `json:"id"`
					Object   string `json:"object"`
					Customer any    `json:"customer"`
				} `json:"object"`
			} `json:"data"`
		}
		if err := json.Unmarshal(ev.Payload, &e); err != nil {
			return nil, fmt.Errorf("reading event %s: %w", ev.ID, err)
		}
		o := e.Data.Object
		if _, ok := paid[o.ID]; !ok || o.Object != "invoice" {
			continue
		}
		if cus, ok := o.Customer.(string); ok && cus != "" {
			out[o.ID] = cus
		}
	}
	for inv := range paid {
		if _, ok := out[inv]; !ok {
			return nil, fmt.Errorf("no event names the customer of invoice %s", inv)
		}
	}
	return out, nil
}

// checkWritebacks waits until no intent of the run is pending (giving up
// only when the number pending has not shrunk for stall: a state, not a
// time), then reads the run's intents and what the stand-in at apiURL
// applied, and judges them.
func checkWritebacks(ctx context.Context, dbURL, apiURL, run string, payments map[string]string, stall time.Duration) (writebacks, error) {
	prefix := handlers.CustomerMetadataKey("in_" + run + "_")
	prefix = strings.TrimSuffix(prefix, ":payment")
	waitUntilNone(ctx, dbURL, stall, countPendingIntents, prefix)

	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	conn, err := connect(cctx, dbURL)
	if err != nil {
		return writebacks{}, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var intents []intentRow
	rows, err := conn.Query(cctx, selectRunIntents, prefix)
	if err != nil {
		return writebacks{}, fmt.Errorf("reading writeback_intents: %w", err)
	}
	for rows.Next() {
		var in intentRow
		if err := rows.Scan(&in.Key, &in.Target, &in.Status, &in.Via, &in.ResultID, &in.Attempts); err != nil {
			return writebacks{}, fmt.Errorf("reading writeback_intents: %w", err)
		}
		intents = append(intents, in)
	}
	if err := rows.Err(); err != nil {
		return writebacks{}, fmt.Errorf("reading writeback_intents: %w", err)
	}

	req, err := http.NewRequestWithContext(cctx, http.MethodGet, strings.TrimRight(apiURL, "/")+standinAppliedPath, nil)
	if err != nil {
		return writebacks{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return writebacks{}, fmt.Errorf("reading the Stripe API stand-in: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return writebacks{}, fmt.Errorf("reading the Stripe API stand-in: %s", resp.Status)
	}
	var all []appliedKey
	if err := json.NewDecoder(resp.Body).Decode(&all); err != nil {
		return writebacks{}, fmt.Errorf("reading the Stripe API stand-in: %w", err)
	}
	var ours []appliedKey // the stand-in serves every scenario of a suite
	for _, a := range all {
		if strings.HasPrefix(a.Key, prefix) {
			ours = append(ours, a)
		}
	}
	sort.Slice(ours, func(i, j int) bool { return ours[i].Key < ours[j].Key })
	return judgeWritebacks(payments, intents, ours), nil
}
