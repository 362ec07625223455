package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/stripe-inbox/inbox/internal/secrets"
	"github.com/stripe-inbox/inbox/internal/stripetest"
	"github.com/stripe-inbox/inbox/internal/webhook"
)

func receipts(ctx context.Context, out io.Writer) {
	fmt.Fprintln(out, "## 1. Receipts: Function URL event → verify → INSERT … ON CONFLICT → 200")
	fmt.Fprintln(out)
	fmt.Fprintln(out, "Limit: pgbench running the identical INSERT (prepared) at the same concurrency, same duration.")
	fmt.Fprintln(out)
	dur := 4 * time.Second
	if *quick {
		dur = 2 * time.Second
	}
	var t table
	for _, c := range []int{1, 4, 16, 64} {
		exec0(ctx, "TRUNCATE webhook_inbox")
		exec0(ctx, "CHECKPOINT") // each timed run starts right after one, as in the drain
		pool := open(ctx, int32(c))
		keyring, err := secrets.NewKeyring(ctx, map[string]string{"billing": secret}, secrets.Literal, secrets.Options{})
		check(err)
		h := webhook.New(keyring, pool, quiet, nil, webhook.Config{})
		var n atomic.Int64
		lat := make([][]time.Duration, c)
		var failed atomic.Int64
		deadline := time.Now().Add(dur)
		var wg sync.WaitGroup
		start := time.Now()
		for g := range c {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; time.Now().Before(deadline); i++ {
					req := functionURLRequest(fmt.Sprintf("evt_b_%d_%d", g, i))
					t0 := time.Now()
					resp, _ := h.Handle(ctx, req)
					lat[g] = append(lat[g], time.Since(t0))
					if resp.StatusCode != 200 {
						failed.Add(1)
					}
					n.Add(1)
				}
			}()
		}
		wg.Wait()
		elapsed := time.Since(start)
		pool.Close()
		all := slices.Concat(lat...)
		slices.Sort(all)
		ours := float64(n.Load()) / elapsed.Seconds()
		stored := count(ctx, "SELECT count(*) FROM webhook_inbox")

		exec0(ctx, "TRUNCATE webhook_inbox")
		exec0(ctx, "CHECKPOINT")
		// The payload comes from a one-row table: pgbench would read the
		// colons of a JSON literal as variables.
		exec0(ctx, "CREATE TABLE IF NOT EXISTS bench_payload AS SELECT $1::text AS p", string(samplePayload("evt_x")))
		limit := pgbench(ctx, c, dur, "prepared", `\set id random(1, 4000000000000000000)
INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, api_version, livemode, account, object_id, payload)
SELECT 'stripe', 'billing', 'evt_pg_' || :client_id || '_' || :id, 'invoice.paid', '`+stripetest.APIVersion+`', false, NULL, 'in_1', p::jsonb FROM bench_payload
ON CONFLICT (provider, endpoint, event_id) DO NOTHING;`)
		t.add(strconv.Itoa(c), f0(ours), ms(pct(all, 50)), ms(pct(all, 99)), f0(limit.tps), ratio(ours, limit.tps),
			fmt.Sprintf("%d/%d", stored, n.Load()-failed.Load()))
	}
	t.print(out, "concurrency", "ours req/s", "p50 ms", "p99 ms", "pgbench INSERT tps (limit)", "ours/limit", "rows stored / 200s")
}

func samplePayload(id string) []byte {
	return stripetest.Event(id, "invoice.paid", stripetest.Invoice("in_1", "cus_1", "paid", 1000))
}

func functionURLRequest(id string) events.LambdaFunctionURLRequest {
	body := samplePayload(id)
	return events.LambdaFunctionURLRequest{
		Version: "2.0", RawPath: "/billing", Body: string(body),
		Headers: map[string]string{"content-type": "application/json", "stripe-signature": stripetest.Sign(body, time.Now(), secret)},
		RequestContext: events.LambdaFunctionURLRequestContext{
			HTTP: events.LambdaFunctionURLRequestContextHTTPDescription{Method: "POST", Path: "/billing"},
		},
	}
}
