package main

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stripe-inbox/inbox/internal/benchsql"
	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/worker"
)

// rtt measures the drain and the receipt path with latency between the
// client and PostgreSQL, as on AWS, where every statement goes through RDS
// Proxy and a round trip costs about 1 ms: toxiproxy's latency toxic delays
// every chunk of bytes by the given time in each direction (upstream and
// downstream), so a round trip costs twice that. It holds each chunk until
// the given time after the chunk arrived (toxics/latency.go of v2.12.0:
// sleep := delay - time.Since(c.Timestamp)), not after the previous one, so
// the statements of one pipeline cross together, as they would over a
// network. At 0 the clients still go through the proxy.
//
// The drain compares, at 1, 4 and 8 drainers: one receipt per transaction
// (BATCH_SIZE=1), batches without the pipeline (loopDrain: a savepoint, then
// the handler's statements one round trip each, per receipt), and the
// worker's batches (the pipeline). Limits: pgbench running the seed's
// per-row transactions, and the webhook's INSERT, through the same proxy.
func rtt(ctx context.Context, out io.Writer) {
	n := 1500
	if *quick {
		n = 100
	}
	fmt.Fprintf(out, "## 2b. Round-trip latency: drain and receipts through toxiproxy with its latency toxic (%d receipts of the drain's mix)\n\n", n)
	if *toxiAPI == "" || *toxiPort == 0 {
		fmt.Fprintln(out, "Skipped: no toxiproxy (scripts/bench.sh starts one).")
		fmt.Fprintln(out)
		return
	}
	proxied := viaPort(*dbURL, *toxiPort)
	fmt.Fprintln(out, "Each direction delayed by the given latency (a round trip costs twice that). Drain limit: pgbench running the seed's per-row transactions with the packages' SQL (as in section 2) through the same proxy. Receipt limit: pgbench running the webhook's INSERT through the same proxy. One run each. CPU busy: the share of the CPU time not idle during the pipelined drain (/proc/stat), as in section 2; toxiproxy's own CPU is included.")
	fmt.Fprintln(out)
	evs := backlog(n)

	var drainT, recT table
	dur := 4 * time.Second
	lats := []int{0, 1}
	if *quick {
		dur, lats = time.Second, []int{1}
	}
	drainers, concurrencies := []int{1, 4, 8}, []int{1, 16}
	if *quick {
		drainers, concurrencies = []int{4}, []int{16}
	}
	for _, lat := range lats {
		setLatency(lat)
		for _, pinned := range cpuModes() {
			withCPUs(ctx, pinned, func() {
				// The receipt runs below empty the inbox: load the backlog
				// again (directly, not through the proxy).
				exec0(ctx, "TRUNCATE webhook_inbox, invoices, ledger_entries, outbox, anomalies, refunds, payment_links")
				load(ctx, evs)
				for _, d := range drainers {
					resetBacklog(ctx)
					perRow := runWorkerOn(ctx, proxied, d, 1).rate()
					resetBacklog(ctx)
					nl, el := loopDrain(ctx, proxied, d, worker.DefaultBatchSize)
					loop := float64(nl) / el.Seconds()
					resetBacklog(ctx)
					piped := runWorkerOn(ctx, proxied, d, 0)
					pipe := piped.rate()
					limit := pgbenchDrain(ctx, proxied, d, n)
					drainT.add(strconv.Itoa(lat), cpuLabel(pinned), strconv.Itoa(d), f0(perRow), f0(loop), f0(pipe), ratio(loop, pipe), ratio(pipe, perRow),
						f0(limit), ratio(perRow, limit), ratio(loop, limit), ratio(pipe, limit), piped.cpuBusy.label(pinned))
				}
				for _, c := range concurrencies {
					r := receiptRun(ctx, proxied, c, dur)
					limit := storeLimit(ctx, proxied, c, dur)
					recT.add(strconv.Itoa(lat), cpuLabel(pinned), strconv.Itoa(c), f0(r.rate), ms(r.p50), ms(r.p99), f0(limit), ratio(r.rate, limit),
						fmt.Sprintf("%d/%d", r.stored, r.ok))
				}
			})
		}
	}
	setLatency(0)
	fmt.Fprintf(out, "Drain (receipts/s; batches of %d; loop = batches without the pipeline):\n\n", worker.DefaultBatchSize)
	drainT.print(out, "latency each way ms", "CPUs", "drainers", "per-row", "loop", "pipeline", "loop/pipeline", "pipeline/per-row",
		"pgbench per-row tps (limit)", "per-row/limit", "loop/limit", "pipeline/limit", "CPU busy (pipeline)")
	fmt.Fprintln(out, "Receipts:")
	fmt.Fprintln(out)
	recT.print(out, "latency each way ms", "CPUs", "concurrency", "ours req/s", "p50 ms", "p99 ms", "pgbench INSERT tps (limit)", "ours/limit", "rows stored / 200s")
}

// viaPort is u with its host replaced by 127.0.0.1:port.
func viaPort(u string, port int) string {
	p, err := url.Parse(u)
	check(err)
	p.Host = "127.0.0.1:" + strconv.Itoa(port)
	return p.String()
}

// setLatency sets toxiproxy's latency toxic on the proxy to ms in each
// direction (0: none). The API is the server's own (api.go of v2.12.0; see
// scripts/lib/toxiproxy.sh).
func setLatency(ms int) {
	for _, stream := range []string{"upstream", "downstream"} {
		name := "latency_" + stream
		req, err := http.NewRequest(http.MethodDelete, *toxiAPI+"/proxies/"+*toxiProxy+"/toxics/"+name, nil)
		check(err)
		resp, err := http.DefaultClient.Do(req)
		check(err)
		resp.Body.Close() // 404 when there was none
		if ms == 0 {
			continue
		}
		body := fmt.Sprintf(`{"name":%q,"type":"latency","stream":%q,"toxicity":1,"attributes":{"latency":%d,"jitter":0}}`, name, stream, ms)
		resp, err = http.Post(*toxiAPI+"/proxies/"+*toxiProxy+"/toxics", "application/json", bytes.NewBufferString(body))
		check(err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			fail(fmt.Errorf("adding the latency toxic: %s %s", resp.Status, b))
		}
	}
}

// loopDrain drains the inbox as the worker's batches would without the
// pipeline: claims of the worker's size, then per transaction of up to
// batch receipts the statement timeout, one statement locking them all,
// for each receipt (in business-key order) a SAVEPOINT and its handler's
// statements, each its own round trip (rolled back to the savepoint when it
// fails, and its failure recorded), one statement marking the applied ones
// processed, and the commit. It returns how many receipts it marked
// processed, and the time it took.
func loopDrain(ctx context.Context, url string, drainers, batch int) (int, time.Duration) {
	pool := openURL(ctx, url, int32(drainers), true)
	defer pool.Close()
	warm(ctx, pool)
	reg := handlers.Default()
	timeout := fmt.Sprintf("%dms", worker.DefaultStatementTimeout.Milliseconds())
	var (
		mu    sync.Mutex
		total int
		wg    sync.WaitGroup
	)
	start := time.Now()
	for range drainers {
		wg.Go(func() {
			conn, err := pool.Acquire(ctx)
			check(err)
			defer conn.Release()
			for {
				claimed, err := inbox.Claim(ctx, conn, inbox.ClaimParams{MaxAttempts: worker.DefaultMaxAttempts, Limit: worker.DefaultClaimLimit,
					Lease: worker.DefaultLease, StatementTimeout: worker.DefaultStatementTimeout})
				check(err)
				if len(claimed) == 0 {
					return
				}
				for i := 0; i < len(claimed); i += batch {
					done := loopBatch(ctx, conn.Conn(), reg, timeout, claimed[i:min(i+batch, len(claimed))])
					mu.Lock()
					total += done
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	return total, time.Since(start)
}

func loopBatch(ctx context.Context, conn *pgx.Conn, reg handlers.Registry, timeout string, b []inbox.Claimed) int {
	b = slices.Clone(b)
	slices.SortFunc(b, func(x, y inbox.Claimed) int {
		return cmp.Or(cmp.Compare(x.LockKey, y.LockKey), cmp.Compare(x.EventID, y.EventID)) // the worker's order (lockOrder), without its split of unlinked refunds
	})
	tx, err := conn.Begin(ctx)
	check(err)
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // after the commit, a no-op
	_, err = tx.Exec(ctx, benchsql.SetLocalStatementTimeoutSQL, timeout)
	check(err)
	keys := make([]inbox.Key, len(b))
	for i, c := range b {
		keys[i] = c.Key
	}
	locked, err := inbox.LockMany(ctx, tx, keys)
	check(err)
	var done []inbox.Key
	var outcomes []string
	for i, c := range b {
		l, ok := locked[c.Key]
		if !ok {
			continue
		}
		sp := "r" + strconv.Itoa(i)
		_, err := tx.Exec(ctx, "SAVEPOINT "+sp)
		check(err)
		res, err := reg.Apply(ctx, tx, handlers.Event{ID: c.EventID, Type: l.EventType, Endpoint: c.Endpoint, Payload: l.Payload, Livemode: l.Livemode, Account: l.Account})
		if err != nil {
			_, rerr := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+sp)
			check(rerr)
			check(inbox.RecordFailure(ctx, tx, c.Key, err.Error(), time.Second, nil, worker.DefaultMaxAttempts))
			continue
		}
		done = append(done, c.Key)
		outcomes = append(outcomes, string(res.Outcome))
	}
	_, err = inbox.MarkManyProcessed(ctx, tx, done, outcomes, nil)
	check(err)
	check(tx.Commit(ctx))
	return len(done)
}
