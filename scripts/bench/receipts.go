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
	"github.com/stripe-inbox/inbox/internal/benchsql"
	"github.com/stripe-inbox/inbox/internal/secrets"
	"github.com/stripe-inbox/inbox/internal/stripetest"
	"github.com/stripe-inbox/inbox/internal/webhook"
)

func receipts(ctx context.Context, out io.Writer) {
	fmt.Fprintln(out, "## 1. Receipts: Function URL event → verify → INSERT … ON CONFLICT → 200")
	fmt.Fprintln(out)
	fmt.Fprintln(out, "Limit: pgbench running the webhook's INSERT (internal/inbox's statement, prepared) at the same concurrency, same duration.")
	fmt.Fprintln(out)
	dur := 4 * time.Second
	concurrencies := []int{1, 4, 16, 64}
	if *quick {
		dur, concurrencies = time.Second, []int{16}
	}
	var t table
	for _, c := range concurrencies {
		for _, pinned := range cpuModes() {
			withCPUs(ctx, pinned, func() {
				r := receiptRun(ctx, *dbURL, c, dur)
				limit := storeLimit(ctx, *dbURL, c, dur)
				t.add(strconv.Itoa(c), cpuLabel(pinned), f0(r.rate), ms(r.p50), ms(r.p99), f0(limit), ratio(r.rate, limit),
					fmt.Sprintf("%d/%d", r.stored, r.ok))
			})
		}
	}
	t.print(out, "concurrency", "CPUs", "ours req/s", "p50 ms", "p99 ms", "pgbench INSERT tps (limit)", "ours/limit", "rows stored / 200s")
}

// receiptResult is what receiptRun measured.
type receiptResult struct {
	rate     float64 // requests per second
	p50, p99 time.Duration
	stored   int64 // rows in webhook_inbox afterwards
	ok       int64 // 200 answers
}

// receiptRun sends Function URL events to the webhook's handler from c
// goroutines for d, the handler's pool connected to url, on an empty inbox
// right after a checkpoint.
func receiptRun(ctx context.Context, url string, c int, d time.Duration) receiptResult {
	exec0(ctx, "TRUNCATE webhook_inbox")
	checkpoint(ctx) // each timed run starts right after one, as in the drain
	pool := openURL(ctx, url, int32(c), false)
	warm(ctx, pool)
	keyring, err := secrets.NewKeyring(ctx, map[string]string{"billing": secret}, secrets.Literal, secrets.Options{})
	check(err)
	h, err := webhook.New(pool, keyring, webhook.Config{}, quiet, nil)
	check(err)
	var n atomic.Int64
	lat := make([][]time.Duration, c)
	var failed atomic.Int64
	deadline := time.Now().Add(d)
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
	return receiptResult{rate: float64(n.Load()) / elapsed.Seconds(), p50: pct(all, 50), p99: pct(all, 99),
		stored: count(ctx, "SELECT count(*) FROM webhook_inbox"), ok: n.Load() - failed.Load()}
}

// storeLimit is pgbench's rate for the webhook's INSERT (storeScript) at
// concurrency c for d, through url, on an empty inbox right after a
// checkpoint.
func storeLimit(ctx context.Context, url string, c int, d time.Duration) float64 {
	exec0(ctx, "TRUNCATE webhook_inbox")
	checkpoint(ctx)
	exec0(ctx, "CREATE TABLE IF NOT EXISTS bench_payload AS SELECT $1::text AS p", string(samplePayload("evt_x")))
	return pgbenchOn(ctx, url, c, d, "prepared", storeScript()).tps
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

// storeScript is the pgbench script of the receipt's limit: the webhook's
// INSERT (benchsql.StoreSQL), with a new event id each time. The payload comes
// from a one-row table (bench_payload, created by the caller): pgbench would
// read the colons of a JSON literal as variables.
func storeScript() string {
	return "\\set id random(1, 4000000000000000000)\n" + pgbenchSQL(benchsql.StoreSQL,
		"'stripe'", "'billing'", "'evt_pg_' || :client_id || '_' || :id", "'invoice.paid'", "'"+stripetest.APIVersion+"'",
		"false", "NULL", "'in_1'", "(SELECT p FROM bench_payload)", "NULL", "NULL", "NULL", "'webhook'") + ";"
}
