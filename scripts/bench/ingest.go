package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stripe-inbox/inbox/internal/stripetest"
)

// ingest compares the two ways a Stripe event reaches the inbox (issue 26)
// through one cmd/local process: the signed webhook (POST /billing:
// signature, INSERT … ON CONFLICT, 200) and EventBridge (POST
// /_eventbridge: the envelope EventBridge hands a target, through the ingest
// function's handler: envelope and source checks, the same store
// statement, 200). Rounds alternate between the two routes at the same
// concurrency, each on an empty inbox right after a checkpoint, so that a
// busy machine slows both alike; the ratio is the medians'.
func ingest(ctx context.Context, out io.Writer) {
	fmt.Fprintln(out, "## 10. Ingest: the signed webhook vs EventBridge (POST /_eventbridge), one local runner")
	fmt.Fprintln(out)
	dur, rounds, concurrencies := 4*time.Second, 3, []int{4, 16}
	if *quick {
		dur, rounds, concurrencies = time.Second, 1, []int{16}
	}
	fmt.Fprintf(out, "cmd/local (webhook only, NOTIFY=off as deployed, LOG_LEVEL=warn, DB_MAX_CONNS = concurrency) over HTTP on loopback; the same invoice.paid Event with a new id per request, "+
		"signed to /billing or in an EventBridge envelope (source aws.partner/stripe.com/ed_test_…) to /_eventbridge; %d alternating rounds of %s per route and concurrency, "+
		"each on an empty inbox; req/s is the median round's. Not pinned (a separate process).\n\n", rounds, dur)
	var t table
	for _, c := range concurrencies {
		// NOTIFY=off: the stack's default (config.LoadWebhook), which the
		// local runner turns on for resident workers; a notifying commit
		// takes PostgreSQL's one notify-queue lock, so the webhook would
		// commit one receipt at a time while the ingest handler, which
		// does not notify, commits in groups: a ratio of the lock, not of
		// the routes.
		r := startLocal(true, "LOCAL_COMPONENTS=webhook", "NOTIFY=off", "LOG_LEVEL=warn", "DB_MAX_CONNS="+strconv.Itoa(c))
		if r.ebURL == "" {
			r.stop()
			fail(fmt.Errorf("cmd/local printed no /_eventbridge URL:\n%s", r.stdout))
		}
		var hookRates, ebRates []float64
		var hook, eb routeResult
		for round := range rounds {
			for _, viaEB := range []bool{round%2 == 1, round%2 == 0} { // alternate which goes first
				exec0(ctx, "TRUNCATE webhook_inbox")
				checkpoint(ctx)
				res := postRun(ctx, r, viaEB, c, dur, round)
				stored := count(ctx, "SELECT count(*) FROM webhook_inbox WHERE source = "+map[bool]string{true: "'eventbridge'", false: "'webhook'"}[viaEB])
				if viaEB {
					ebRates = append(ebRates, res.rate)
					eb.add(res, stored)
				} else {
					hookRates = append(hookRates, res.rate)
					hook.add(res, stored)
				}
			}
		}
		r.stop()
		h, e := median(hookRates), median(ebRates)
		fmt.Fprintf(os.Stderr, "ingest: concurrency %d: webhook %s req/s, eventbridge %s req/s\n", c, rates(hookRates), rates(ebRates))
		t.add(strconv.Itoa(c), f0(h), f0(e), ratio(e, h), rates(hookRates), rates(ebRates),
			fmt.Sprintf("%d/%d", hook.stored, hook.ok), fmt.Sprintf("%d/%d", eb.stored, eb.ok))
	}
	t.print(out, "concurrency", "webhook req/s", "EventBridge req/s", "EventBridge/webhook",
		"webhook rounds", "EventBridge rounds", "webhook rows stored / 200s", "EventBridge rows stored / 200s")
}

// routeResult sums one route's rounds.
type routeResult struct {
	ok, stored int64
}

func (r *routeResult) add(res postResult, stored int64) {
	r.ok += res.ok
	r.stored += stored
}

// postResult is one round of postRun.
type postResult struct {
	rate float64 // requests per second
	ok   int64   // 200 answers
}

// postRun POSTs a new event from each of c goroutines, one after another,
// for d: signed to the webhook's URL, or (viaEB) in an EventBridge envelope
// to /_eventbridge.
func postRun(ctx context.Context, r *localRunner, viaEB bool, c int, d time.Duration, round int) postResult {
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: c, Proxy: nil}}
	defer client.CloseIdleConnections()
	var n, ok atomic.Int64
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	start := time.Now()
	for g := range c {
		wg.Go(func() {
			for i := 0; time.Now().Before(deadline); i++ {
				id := fmt.Sprintf("evt_i_%t_%d_%d_%d", viaEB, round, g, i)
				payload := samplePayload(id)
				url, body := r.url, payload
				if viaEB {
					url, body = r.ebURL, stripetest.EventBridge("eb-"+id, stripetest.EventBridgeSource, payload)
				}
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
				check(err)
				req.Header.Set("Content-Type", "application/json")
				if !viaEB {
					req.Header.Set("Stripe-Signature", stripetest.Sign(payload, time.Now(), secret))
				}
				resp, err := client.Do(req)
				n.Add(1)
				if err != nil {
					continue
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK && strings.Contains(string(b), `"stored"`) {
					ok.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return postResult{rate: float64(n.Load()) / time.Since(start).Seconds(), ok: ok.Load()}
}
