package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/stripe-inbox/inbox/internal/retention"
	"github.com/stripe-inbox/inbox/internal/secrets"
	"github.com/stripe-inbox/inbox/internal/webhook"
)

func purge(ctx context.Context, out io.Writer) {
	n := 1_000_000
	if *quick {
		n = 5_000
	}
	fmt.Fprintf(out, "## 4. Purge: %d expired receipts, batches of 1000\n\n", n)
	exec0(ctx, "TRUNCATE webhook_inbox, invoices, ledger_entries, outbox, anomalies, refunds, payment_links")
	exec0(ctx, `INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, object_id, payload, received_at, processed_at, outcome, attempts)
		SELECT 'stripe', 'billing', 'evt_old_' || g, 'invoice.paid', false, 'in_old', $1::jsonb, now() - interval '60 days', now() - interval '60 days', 'applied', 1
		  FROM generate_series(1, $2) g`, string(samplePayload("evt_old")), n)
	exec0(ctx, "VACUUM ANALYZE webhook_inbox")

	// Receipt p99 alone, then while the purge runs.
	aloneFor := 3 * time.Second
	if *quick {
		aloneFor = time.Second
	}
	alone := receiptLatency(ctx, 4, aloneFor, "a")

	cfg := retention.Config{BatchSize: 1000}.WithDefaults()
	check(cfg.Validate())
	pool := open(ctx, 2)
	p, err := retention.New(pool, cfg, quiet, nil)
	check(err)
	done := make(chan struct{})
	var sum retention.Summary
	var perr error
	start := time.Now()
	go func() { sum, perr = p.Run(ctx); close(done) }()
	during := receiptLatencyUntil(ctx, 4, done, "b")
	<-done
	elapsed := time.Since(start)
	pool.Close()
	check(perr)
	var t table
	t.add(strconv.FormatInt(sum.PurgedReceipts, 10), fmt.Sprintf("%.1f", elapsed.Seconds()), f0(float64(sum.PurgedReceipts)/elapsed.Seconds()),
		ms(pct(alone, 99)), ms(pct(during, 99)), ratio(pct(during, 99).Seconds(), pct(alone, 99).Seconds()))
	t.print(out, "rows purged", "seconds", "rows/s", "receipt p99 ms alone", "receipt p99 ms during purge", "during/alone")
}

func receiptLatency(ctx context.Context, c int, d time.Duration, tag string) []time.Duration {
	done := make(chan struct{})
	time.AfterFunc(d, func() { close(done) })
	return receiptLatencyUntil(ctx, c, done, tag)
}

func receiptLatencyUntil(ctx context.Context, c int, done <-chan struct{}, tag string) []time.Duration {
	pool := open(ctx, int32(c))
	defer pool.Close()
	keyring, err := secrets.NewKeyring(ctx, map[string]string{"billing": secret}, secrets.Literal, secrets.Options{})
	check(err)
	h, err := webhook.New(pool, keyring, webhook.Config{}, quiet, nil)
	check(err)
	var mu sync.Mutex
	var all []time.Duration
	var wg sync.WaitGroup
	for g := range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var lat []time.Duration
			for i := 0; ; i++ {
				select {
				case <-done:
					mu.Lock()
					all = append(all, lat...)
					mu.Unlock()
					return
				default:
				}
				t0 := time.Now()
				resp, _ := h.Handle(ctx, functionURLRequest(fmt.Sprintf("evt_l%s_%d_%d", tag, g, i)))
				if resp.StatusCode != 200 {
					fail(fmt.Errorf("receipt failed during the purge benchmark: %d %s", resp.StatusCode, resp.Body))
				}
				lat = append(lat, time.Since(t0))
			}
		}()
	}
	wg.Wait()
	slices.Sort(all)
	return all
}
