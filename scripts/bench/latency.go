package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stripe-inbox/inbox/internal/stripeevent"
	"github.com/stripe-inbox/inbox/internal/stripetest"
)

// latencyMode is one way of running the worker in the latency section.
type latencyMode struct {
	name string
	env  []string
}

// latency streams the invoice lifecycle mix at a steady rate through the
// local runner's webhook (HTTP, signature, INSERT) and measures
// receipt-to-effect (processed_at - received_at) for each receipt, with the
// worker resident (woken by NOTIFY, or polling only) and scheduled-only with
// one run a minute (the local runner standing in for the schedule).
func latency(ctx context.Context, out io.Writer) {
	// The scheduled-only worker runs every interval (the deployed cadence,
	// or 3 s in a smoke run, which also streams for 2 s at one rate only).
	dur, interval, eventRates := 60*time.Second, 60*time.Second, []int{50, 500}
	if *quick {
		dur, interval, eventRates = 2*time.Second, 3*time.Second, []int{50}
	}
	fmt.Fprintln(out, "## 7. Receipt to effect: a steady stream through the webhook, resident worker vs one run a minute")
	fmt.Fprintln(out)
	fmt.Fprintf(out, "cmd/local (webhook + worker, one process, defaults otherwise: 4 drainers, batches of 50) with WORKER_INTERVAL=%s "+
		"(the deployed cadence); the invoice lifecycle mix (created, finalized, paid or voided, second Event objects, refunds; shuffled) "+
		"signed and POSTed at a steady rate for %s; latency is processed_at - received_at of every receipt, read from the table once all are processed.\n\n", interval, dur)
	modes := []latencyMode{
		{"resident, NOTIFY/LISTEN (local default)", []string{"POLL_INTERVAL=250ms", "LISTEN=on", "NOTIFY=on"}},
		{"resident, polling every 250ms only", []string{"POLL_INTERVAL=250ms", "LISTEN=off", "NOTIFY=off"}},
		// The stack's default since issue 25: not resident, the webhook
		// starts a run after each new receipt (WORKER_WAKE, internal/wake).
		{"woken by the webhook, not resident (stack default)", []string{"POLL_INTERVAL=0", "LISTEN=off", "NOTIFY=off", "WORKER_WAKE=on"}},
		{"scheduled only, one run a minute", []string{"POLL_INTERVAL=0", "LISTEN=off", "NOTIFY=off"}},
	}
	var t table
	for _, rate := range eventRates {
		for _, m := range modes {
			exec0(ctx, "TRUNCATE webhook_inbox, invoices, ledger_entries, outbox, anomalies, refunds, payment_links")
			checkpoint(ctx)
			r := startLocal(true, append([]string{"LOCAL_COMPONENTS=webhook,worker", "WORKER_INTERVAL=" + interval.String(), "LOG_LEVEL=warn"}, m.env...)...)
			sent, failed, achieved := stream(ctx, r.url, rate, dur)
			drained := waitDrained(ctx, 4*time.Minute)
			r.stop()
			var n int64
			var p50, p99, mx float64
			check(pool0(ctx).QueryRow(ctx, `
SELECT count(*),
       coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY l), 0),
       coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY l), 0),
       coalesce(max(l), 0)
  FROM (SELECT extract(epoch FROM processed_at - received_at) * 1000 AS l
          FROM webhook_inbox WHERE processed_at IS NOT NULL) AS x`).Scan(&n, &p50, &p99, &mx))
			note := ""
			if !drained {
				note = " (not drained!)"
			}
			t.add(fmt.Sprint(rate), m.name, fmt.Sprintf("%d/%d%s", n, sent-failed, note), f0(achieved),
				fmt.Sprintf("%.0f", p50), fmt.Sprintf("%.0f", p99), fmt.Sprintf("%.0f", mx))
			fmt.Fprintf(os.Stderr, "latency: %d/s %s: p50 %.0f ms p99 %.0f ms max %.0f ms\n", rate, m.name, p50, p99, mx)
		}
	}
	t.print(out, "events/s", "worker", "receipts processed / stored", "sent/s", "p50 ms", "p99 ms", "max ms")
}

// stream POSTs events at rate per second for d, and returns how many it
// sent, how many were not answered 2xx, and the rate it achieved.
func stream(ctx context.Context, url string, rate int, d time.Duration) (sent, failed int64, achieved float64) {
	evs := backlog(int(float64(rate) * d.Seconds()))
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	ch := make(chan stripeevent.Event, 1024)
	var nSent, nFailed atomic.Int64
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ev := range ch {
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(ev.Payload))
				check(err)
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Stripe-Signature", stripetest.Sign(ev.Payload, time.Now(), secret))
				resp, err := client.Do(req)
				nSent.Add(1)
				if err != nil {
					nFailed.Add(1)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					nFailed.Add(1)
				}
			}
		}()
	}
	start := time.Now()
	for i, ev := range evs {
		if wait := time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate))); wait > 0 {
			time.Sleep(wait)
		}
		ch <- ev
	}
	close(ch)
	wg.Wait()
	return nSent.Load(), nFailed.Load(), float64(nSent.Load()) / time.Since(start).Seconds()
}

// waitDrained waits until no receipt is unprocessed (at most max), and
// reports whether that happened.
func waitDrained(ctx context.Context, max time.Duration) bool {
	deadline := time.Now().Add(max)
	for time.Now().Before(deadline) {
		if count(ctx, "SELECT count(*) FROM webhook_inbox WHERE processed_at IS NULL") == 0 {
			return true
		}
		time.Sleep(200 * time.Millisecond)
	}
	return false
}
