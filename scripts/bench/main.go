// Command bench measures the receipt path, the drain, scale and purge against
// limits measured in the same run (pgbench doing the same SQL), and prints a
// markdown table. scripts/bench.sh runs it; see that script for the set-up.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stripe-inbox/inbox/internal/database"
	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/migrate"
	"github.com/stripe-inbox/inbox/internal/retention"
	"github.com/stripe-inbox/inbox/internal/secrets"
	"github.com/stripe-inbox/inbox/internal/stripeevent"
	"github.com/stripe-inbox/inbox/internal/stripetest"
	"github.com/stripe-inbox/inbox/internal/webhook"
	"github.com/stripe-inbox/inbox/internal/worker"
)

const secret = "whsec_bench"

var (
	dbURL     = flag.String("db", "", "URL of the benchmark database (created and migrated by scripts/bench.sh)")
	quick     = flag.Bool("quick", false, "smaller sizes (a smoke run)")
	coldStart = flag.String("coldstart", "", "file with cold-start figures from the e2e suite (E2E_REPORT), if any")
	only      = flag.String("only", "", "comma-separated sections to run (receipts,drain,scale,purge,cold,needsreview,latency,coverage); default all")
	localBin  = flag.String("local", ".tmp/local", "the cmd/local binary (latency and coverage run it as a process; scripts/bench.sh builds it)")
	cpuprof   = flag.String("cpuprofile", "", "write a CPU profile of this process to the file")
	quiet     = slog.New(slog.NewTextHandler(io.Discard, nil))
)

type table struct{ rows [][]string }

func (t *table) add(cols ...string) { t.rows = append(t.rows, cols) }
func (t *table) print(w io.Writer, header ...string) {
	fmt.Fprintln(w, "| "+strings.Join(header, " | ")+" |")
	fmt.Fprintln(w, "|"+strings.Repeat(" --- |", len(header)))
	for _, r := range t.rows {
		fmt.Fprintln(w, "| "+strings.Join(r, " | ")+" |")
	}
	fmt.Fprintln(w)
}

func main() {
	flag.Parse()
	ctx := context.Background()
	if *dbURL == "" {
		fail(fmt.Errorf("-db is required"))
	}
	if *cpuprof != "" {
		f, err := os.Create(*cpuprof)
		check(err)
		check(pprof.StartCPUProfile(f))
		defer pprof.StopCPUProfile()
	}
	conn, err := pgx.Connect(ctx, *dbURL)
	check(err)
	_, err = migrate.Up(ctx, conn) // the project's one migration runner
	check(err)
	conn.Close(ctx)

	out := os.Stdout
	fmt.Fprintf(out, "# Benchmark %s\n\n", time.Now().UTC().Format(time.RFC3339))
	fmt.Fprintf(out, "CPU: %s (%d cores), PostgreSQL: %s\n\n", cpuName(), runtime.NumCPU(), pgVersion(ctx))
	fmt.Fprintf(out, "Settings: %s\n\n", pgSettings(ctx))

	for _, sec := range []struct {
		name string
		run  func()
	}{
		{"receipts", func() { receipts(ctx, out) }},
		{"drain", func() { drain(ctx, out) }},
		{"scale", func() { scale(ctx, out) }},
		{"purge", func() { purge(ctx, out) }},
		{"cold", func() { cold(out) }},
		{"needsreview", func() { needsReview(ctx, out) }},
		{"latency", func() { latency(ctx, out) }},
		{"coverage", func() { coverage(ctx, out) }},
	} {
		if *only == "" || slices.Contains(strings.Split(*only, ","), sec.name) {
			sec.run()
		}
	}
}

// ---------------------------------------------------------------- receipts

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

// ------------------------------------------------------------------- drain

// backlog generates n receipts of invoice lifecycles with duplicates,
// separate Event objects for one fact, and refunds.
func backlog(n int) []stripeevent.Event {
	r := rand.New(rand.NewPCG(1, 2))
	var evs []stripeevent.Event
	add := func(id, typ string, obj map[string]any) {
		payload := stripetest.Event(id, typ, obj)
		ev, err := stripeevent.Verify(payload, stripetest.Sign(payload, time.Now(), secret), []string{secret})
		check(err)
		evs = append(evs, ev)
	}
	for i := 0; len(evs) < n; i++ {
		inv := fmt.Sprintf("in_%07d", i)
		amt := int64(100 + r.IntN(10000))
		add("evt_c_"+inv, "invoice.created", stripetest.Invoice(inv, "cus_1", "draft", amt))
		add("evt_f_"+inv, "invoice.finalized", stripetest.Invoice(inv, "cus_1", "open", amt))
		switch r.IntN(5) {
		case 0:
			add("evt_v_"+inv, "invoice.voided", stripetest.Invoice(inv, "cus_1", "void", amt))
		default:
			add("evt_p_"+inv, "invoice.paid", stripetest.Invoice(inv, "cus_1", "paid", amt))
			if r.IntN(5) == 0 {
				add("evt_p2_"+inv, "invoice.paid", stripetest.Invoice(inv, "cus_1", "paid", amt)) // a second Event object
			}
			if r.IntN(4) == 0 {
				add("evt_r_"+inv, "charge.refunded", stripetest.ChargeWithRefunds("ch_"+inv, inv, map[string]int64{"re_" + inv: amt / 2}))
			}
		}
	}
	r.Shuffle(len(evs), func(i, j int) { evs[i], evs[j] = evs[j], evs[i] })
	return evs[:n]
}

func load(ctx context.Context, evs []stripeevent.Event) {
	pool := open(ctx, 8)
	defer pool.Close()
	var wg sync.WaitGroup
	ch := make(chan stripeevent.Event)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ev := range ch {
				_, err := inbox.Store(ctx, pool, "billing", ev)
				check(err)
			}
		}()
	}
	for _, ev := range evs {
		ch <- ev
	}
	close(ch)
	wg.Wait()
}

func resetBacklog(ctx context.Context) {
	exec0(ctx, "TRUNCATE invoices, ledger_entries, outbox, anomalies")
	exec0(ctx, "UPDATE webhook_inbox SET processed_at = NULL, outcome = NULL, attempts = 0, last_error = NULL, available_at = now()")
	exec0(ctx, "VACUUM ANALYZE webhook_inbox")
	// Every timed run starts right after a checkpoint, so that none of them
	// pays for (or escapes) a checkpoint and its full-page writes by chance.
	exec0(ctx, "CHECKPOINT")
}

func runWorker(ctx context.Context, drainers, batch int) (worker.Summary, time.Duration) {
	pool := openWorkerPool(ctx, int32(drainers+1))
	defer pool.Close()
	// The worker's defaults (claims of 25), with the batch size given; 0 is
	// the default batch.
	cfg := worker.Config{Mode: worker.ModeTest, Concurrency: drainers, BatchSize: batch}.WithDefaults()
	check(cfg.Validate())
	w, err := worker.New(pool, handlers.Default(), cfg, quiet, nil)
	check(err)
	warm(ctx, pool)
	start := time.Now()
	s, err := w.Run(ctx)
	check(err)
	return s, time.Since(start)
}

// warm opens all of the pool's connections before the clock starts. A
// deployed worker keeps its pool across warm invocations, so the drain rate
// should not include connecting (tens of milliseconds a connection here,
// which is a large share of a short batched run).
func warm(ctx context.Context, pool *pgxpool.Pool) {
	conns := make([]*pgxpool.Conn, pool.Config().MaxConns)
	var wg sync.WaitGroup
	for i := range conns {
		wg.Go(func() {
			c, err := pool.Acquire(ctx)
			check(err)
			check(c.Ping(ctx))
			conns[i] = c
		})
	}
	wg.Wait()
	for _, c := range conns {
		c.Release()
	}
}

func drain(ctx context.Context, out io.Writer) {
	n := 6000
	if *quick {
		n = 600
	}
	fmt.Fprintf(out, "## 2. Drain: %d receipts (invoice lifecycles, duplicates, separate Event objects, refunds); median of 3 runs\n\n", n)
	fmt.Fprintln(out, "Limit: pgbench running the seed's per-row transactions (claim one row in its own transaction, then lock, upsert the invoice, book, queue, mark processed, commit) at the same concurrency over a backlog of invoice.paid receipts.")
	fmt.Fprintln(out)
	exec0(ctx, "TRUNCATE webhook_inbox, invoices, ledger_entries, outbox, anomalies")
	load(ctx, backlog(n))
	var t table
	for _, d := range []int{1, 4, 8} {
		// Median of three runs each, interleaved, so that a burst of noise
		// on a shared machine does not decide the ratio.
		var rates1, rates10, limits []float64
		var last worker.Summary
		for range 3 {
			resetBacklog(ctx)
			s1, e1 := runWorker(ctx, d, 1)
			rates1 = append(rates1, float64(s1.Processed+s1.Ignored)/e1.Seconds())
			resetBacklog(ctx)
			s10, e10 := runWorker(ctx, d, 0)
			rates10 = append(rates10, float64(s10.Processed+s10.Ignored)/e10.Seconds())
			last = s10
			limits = append(limits, pgbenchDrain(ctx, d, n))
		}
		rate1, rate10, limit := median(rates1), median(rates10), median(limits)
		s10 := last
		t.add(strconv.Itoa(d), f0(rate1), f0(rate10), ratio(rate10, rate1), f0(limit), ratio(rate1, limit), ratio(rate10, limit),
			fmt.Sprintf("%d+%d", s10.Processed, s10.Ignored))
	}
	t.print(out, "drainers", "per-row receipts/s (batch 1)", fmt.Sprintf("batched receipts/s (batch %d)", worker.DefaultBatchSize), "batched/per-row", "pgbench per-row tps (limit)", "per-row/limit", "batched/limit", "processed")
}

// pgbenchDrain loads n invoice.paid receipts under endpoint 'pgbench' and
// lets pgbench drain them with the seed's two transactions per row.
func pgbenchDrain(ctx context.Context, clients, n int) float64 {
	exec0(ctx, "TRUNCATE invoices, ledger_entries, outbox")
	exec0(ctx, "DELETE FROM webhook_inbox WHERE endpoint = 'pgbench'")
	per := n / clients
	total := per * clients
	exec0(ctx, `INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, object_id, payload)
		SELECT 'stripe', 'pgbench', 'evt_pb_' || g, 'invoice.paid', false, 'in_pb_' || g, $1::jsonb
		  FROM generate_series(1, $2) g`, string(samplePayload("evt_pb")), total)
	exec0(ctx, "VACUUM ANALYZE webhook_inbox")
	exec0(ctx, "CHECKPOINT") // as resetBacklog does before the worker's runs
	res := pgbenchTx(ctx, clients, per, `WITH picked AS (
  SELECT provider, endpoint, event_id FROM webhook_inbox
   WHERE processed_at IS NULL AND endpoint = 'pgbench' AND available_at <= now() AND attempts < 10
   ORDER BY available_at LIMIT 1 FOR UPDATE SKIP LOCKED)
UPDATE webhook_inbox w SET attempts = w.attempts + 1, available_at = now() + interval '2 minutes'
  FROM picked WHERE (w.provider, w.endpoint, w.event_id) = (picked.provider, picked.endpoint, picked.event_id)
RETURNING w.event_id AS eid, w.object_id AS oid \gset
BEGIN;
SELECT set_config('statement_timeout', '10000ms', true);
SELECT event_type, payload FROM webhook_inbox WHERE provider = 'stripe' AND endpoint = 'pgbench' AND event_id = :eid AND processed_at IS NULL FOR UPDATE;
INSERT INTO invoices AS i (id, customer_id, status, currency, amount_due, amount_paid, paid_at) VALUES (:oid, 'cus_1', 'paid', 'usd', 1000, 1000, now())
  ON CONFLICT (id) DO UPDATE SET status = 'paid', updated_at = now() WHERE i.status = ANY ('{draft,open,uncollectible}');
SELECT status FROM invoices WHERE id = :oid FOR UPDATE;
INSERT INTO ledger_entries (invoice_id, kind, amount, currency, event_id) VALUES (:oid, 'payment', 1000, 'usd', :eid) ON CONFLICT DO NOTHING RETURNING id;
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('Invoice', :oid, 'InvoicePaymentBooked', '{}');
UPDATE webhook_inbox SET processed_at = now(), outcome = 'applied', last_error = NULL WHERE provider = 'stripe' AND endpoint = 'pgbench' AND event_id = :eid AND processed_at IS NULL;
COMMIT;`)
	left := count(ctx, "SELECT count(*) FROM webhook_inbox WHERE endpoint = 'pgbench' AND processed_at IS NULL")
	if left != 0 {
		fail(fmt.Errorf("pgbench drain left %d rows", left))
	}
	exec0(ctx, "DELETE FROM webhook_inbox WHERE endpoint = 'pgbench'")
	return res.tps
}

// ------------------------------------------------------------------- scale

func scale(ctx context.Context, out io.Writer) {
	history, pending := 1_000_000, 100_000
	if *quick {
		history, pending = 50_000, 5_000
	}
	fmt.Fprintf(out, "## 3. Scale: claim and drain with %d processed rows and %d backlog, against an empty table\n\n", history, pending)
	var t table
	for _, withHistory := range []bool{false, true} {
		exec0(ctx, "TRUNCATE webhook_inbox, invoices, ledger_entries, outbox, anomalies")
		if withHistory {
			exec0(ctx, `INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, object_id, payload, received_at, processed_at, outcome, attempts)
				SELECT 'stripe', 'billing', 'evt_h_' || g, 'invoice.paid', false, 'in_h_' || g, $1::jsonb,
				       now() - interval '40 days' + g * interval '1 second', now() - interval '40 days' + g * interval '1 second', 'applied', 1
				  FROM generate_series(1, $2) g`, string(samplePayload("evt_h")), history)
		}
		exec0(ctx, `INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, object_id, payload)
			SELECT 'stripe', 'billing', 'evt_q_' || g, 'invoice.paid', false, 'in_q_' || g,
			       jsonb_set($1::jsonb, '{data,object,id}', to_jsonb('in_q_' || g))
			  FROM generate_series(1, $2) g`, string(samplePayload("evt_q")), pending)
		exec0(ctx, "VACUUM ANALYZE webhook_inbox")

		// Claim latency: 200 default-sized claims on one connection.
		conn, err := pgx.Connect(ctx, *dbURL)
		check(err)
		var lat []time.Duration
		for range 200 {
			t0 := time.Now()
			_, err := inbox.Claim(ctx, conn, inbox.ClaimParams{MaxAttempts: 10, Limit: worker.DefaultClaimLimit, Lease: time.Hour})
			check(err)
			lat = append(lat, time.Since(t0))
		}
		conn.Close(ctx)
		slices.Sort(lat)
		exec0(ctx, "UPDATE webhook_inbox SET attempts = 0, available_at = now() WHERE processed_at IS NULL")

		// Drain the backlog with 4 drainers until 30 s before the deadline.
		ctxRun, cancel := context.WithTimeout(ctx, 60*time.Second)
		pool := openWorkerPool(ctx, 5)
		cfg := worker.Config{Mode: worker.ModeTest, Concurrency: 4}.WithDefaults()
		w, err := worker.New(pool, handlers.Default(), cfg, quiet, nil)
		check(err)
		// Bound the run by deadline: ~ 30s of draining.
		start := time.Now()
		s, err := w.Run(ctxRun)
		cancel()
		pool.Close()
		check(err)
		rate := float64(s.Processed) / time.Since(start).Seconds()
		label := "empty table"
		if withHistory {
			label = fmt.Sprintf("%d processed rows", history)
		}
		t.add(label, ms(pct(lat, 50)), ms(pct(lat, 99)), f0(rate), strconv.Itoa(s.Processed))
		if withHistory {
			fmt.Fprintln(out, "EXPLAIN of the claim query with the history present:")
			fmt.Fprintln(out)
			fmt.Fprintln(out, "```")
			rows, err := pool0(ctx).Query(ctx, `EXPLAIN (COSTS OFF) SELECT provider, endpoint, event_id FROM webhook_inbox
				WHERE processed_at IS NULL AND available_at <= now() AND attempts < 10 ORDER BY available_at LIMIT 10 FOR UPDATE SKIP LOCKED`)
			check(err)
			for rows.Next() {
				var line string
				check(rows.Scan(&line))
				fmt.Fprintln(out, line)
			}
			fmt.Fprintln(out, "```")
			fmt.Fprintln(out)
		}
	}
	t.print(out, "table", "claim p50 ms", "claim p99 ms", "drain receipts/s (4 drainers, default batch, 30 s)", "processed")
}

// ------------------------------------------------------------------- purge

func purge(ctx context.Context, out io.Writer) {
	n := 1_000_000
	if *quick {
		n = 50_000
	}
	fmt.Fprintf(out, "## 4. Purge: %d expired receipts, batches of 1000\n\n", n)
	exec0(ctx, "TRUNCATE webhook_inbox, invoices, ledger_entries, outbox, anomalies")
	exec0(ctx, `INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, object_id, payload, received_at, processed_at, outcome, attempts)
		SELECT 'stripe', 'billing', 'evt_old_' || g, 'invoice.paid', false, 'in_old', $1::jsonb, now() - interval '60 days', now() - interval '60 days', 'applied', 1
		  FROM generate_series(1, $2) g`, string(samplePayload("evt_old")), n)
	exec0(ctx, "VACUUM ANALYZE webhook_inbox")

	// Receipt p99 alone, then while the purge runs.
	alone := receiptLatency(ctx, 4, 3*time.Second, "a")

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
	h := webhook.New(keyring, pool, quiet, nil, webhook.Config{})
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

// -------------------------------------------------------------- cold start

func cold(out io.Writer) {
	fmt.Fprintln(out, "## 5. Cold start (host-architecture binaries under aws-lambda-rie, from the e2e suite)")
	fmt.Fprintln(out)
	if *coldStart == "" {
		fmt.Fprintln(out, "No cold-start report given.")
		return
	}
	b, err := os.ReadFile(*coldStart)
	if err != nil {
		fmt.Fprintf(out, "No cold-start report (%v).\n", err)
		return
	}
	var t table
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var r struct {
			Function    string    `json:"function"`
			BinaryBytes int64     `json:"binary_bytes"`
			InitMs      []float64 `json:"init_ms"`
			Min         float64   `json:"init_ms_min"`
			P50         float64   `json:"init_ms_p50"`
			Max         float64   `json:"init_ms_max"`
		}
		if json.Unmarshal([]byte(line), &r) != nil {
			continue
		}
		t.add(r.Function, fmt.Sprintf("%.1f", float64(r.BinaryBytes)/(1<<20)), strconv.Itoa(len(r.InitMs)),
			fmt.Sprintf("%.1f", r.Min), fmt.Sprintf("%.1f", r.P50), fmt.Sprintf("%.1f", r.Max))
	}
	t.print(out, "function", "binary MiB", "cold starts", "INIT min ms", "INIT p50 ms", "INIT max ms")
}

// ------------------------------------------------------------ needs review

// needsReview measures the claim with many receipts waiting for review (an
// incident's worth) against the same claim with none: parked out of the
// claim's index range as the worker leaves them, and, for comparison, left
// in it as they were before (an old available_at at the front of
// webhook_inbox_unprocessed, skipped by the claim's filter one by one).
func needsReview(ctx context.Context, out io.Writer) {
	stuck, pending := 100_000, 20_000
	if *quick {
		stuck, pending = 5_000, 2_000
	}
	claims := pending / (2 * worker.DefaultClaimLimit) // half the backlog, so no claim comes back empty
	fmt.Fprintf(out, "## 6. Needs review: the claim with %d receipts waiting for review, against none\n\n", stuck)
	fmt.Fprintf(out, "%d claims of %d on one connection over a backlog of %d claimable receipts; ratios against the table without needs-review rows, in the same run.\n\n",
		claims, worker.DefaultClaimLimit, pending)
	var t table
	var base []time.Duration
	for _, variant := range []string{"none", "parked", "unparked"} {
		exec0(ctx, "TRUNCATE webhook_inbox, invoices, ledger_entries, outbox, anomalies")
		if variant != "none" {
			// Receipts that failed their last attempt during an incident an
			// hour ago: at the limit, with the available_at of their last
			// backoff.
			exec0(ctx, `INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, object_id, payload, received_at, available_at, attempts, last_error)
				SELECT 'stripe', 'billing', 'evt_nr_' || g, 'invoice.paid', false, 'in_nr_' || g, $1::jsonb,
				       now() - interval '1 hour', now() - interval '1 hour' + g * interval '1 millisecond', $3, 'pg 23502: boom'
				  FROM generate_series(1, $2) g`, string(samplePayload("evt_nr")), stuck, worker.DefaultMaxAttempts)
			if variant == "parked" {
				// What the worker does with rows that reached the limit
				// before claims and failures parked them.
				parked, err := inbox.ParkNeedsReview(ctx, pool0(ctx), worker.DefaultMaxAttempts)
				check(err)
				if parked != stuck {
					fail(fmt.Errorf("parked %d of %d needs-review rows", parked, stuck))
				}
			}
		}
		exec0(ctx, `INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, object_id, payload)
			SELECT 'stripe', 'billing', 'evt_nq_' || g, 'invoice.paid', false, 'in_nq_' || g, $1::jsonb
			  FROM generate_series(1, $2) g`, string(samplePayload("evt_nq")), pending)
		exec0(ctx, "VACUUM ANALYZE webhook_inbox")

		conn, err := pgx.Connect(ctx, *dbURL)
		check(err)
		p := inbox.ClaimParams{MaxAttempts: worker.DefaultMaxAttempts, Limit: worker.DefaultClaimLimit, Lease: time.Hour}
		plan, err := inbox.ExplainClaim(ctx, conn, p, "TEXT")
		check(err)
		var lat []time.Duration
		for range claims {
			t0 := time.Now()
			claimed, err := inbox.Claim(ctx, conn, p)
			check(err)
			lat = append(lat, time.Since(t0))
			if len(claimed) != worker.DefaultClaimLimit {
				fail(fmt.Errorf("a claim took %d receipts, not %d", len(claimed), worker.DefaultClaimLimit))
			}
		}
		conn.Close(ctx)
		slices.Sort(lat)
		backlog, err := inbox.Stats(ctx, pool0(ctx), worker.DefaultMaxAttempts, nil)
		check(err)
		if variant == "none" {
			base = lat
		}
		label := map[string]string{
			"none":     "no needs-review rows",
			"parked":   fmt.Sprintf("%d needs-review rows, parked (this version)", stuck),
			"unparked": fmt.Sprintf("%d needs-review rows in the claim's range (before)", stuck),
		}[variant]
		t.add(label, ms(pct(lat, 50)), ms(pct(lat, 99)), ratio(pct(lat, 50).Seconds(), pct(base, 50).Seconds()),
			ratio(pct(lat, 99).Seconds(), pct(base, 99).Seconds()), strconv.Itoa(backlog.NeedsReview))
		if variant != "none" {
			fmt.Fprintf(out, "EXPLAIN (ANALYZE, BUFFERS) of the claim, %s:\n\n```\n%s\n```\n\n", label, plan)
		}
	}
	t.print(out, "table", "claim p50 ms", "claim p99 ms", "p50 / none", "p99 / none", "NeedsReview counted")
}

// ----------------------------------------------------------------- helpers

var (
	sharedPool *pgxpool.Pool
	sharedOnce sync.Once
)

func pool0(ctx context.Context) *pgxpool.Pool {
	sharedOnce.Do(func() { sharedPool = open(ctx, 2) })
	return sharedPool
}

func open(ctx context.Context, conns int32) *pgxpool.Pool {
	p, err := database.Open(ctx, database.Config{URL: *dbURL, MaxConns: conns}, nil)
	check(err)
	return p
}

// openWorkerPool opens a pool configured as the worker's (config.LoadWorker).
func openWorkerPool(ctx context.Context, conns int32) *pgxpool.Pool {
	p, err := database.Open(ctx, database.Config{URL: *dbURL, MaxConns: conns, PreparedStatements: true}, nil)
	check(err)
	return p
}

func exec0(ctx context.Context, sql string, args ...any) {
	if _, err := pool0(ctx).Exec(ctx, sql, args...); err != nil {
		fail(fmt.Errorf("%s: %w", strings.Fields(sql)[0], err))
	}
}

func count(ctx context.Context, sql string) int64 {
	var n int64
	check(pool0(ctx).QueryRow(ctx, sql).Scan(&n))
	return n
}

type pgbenchResult struct{ tps float64 }

var tpsLine = regexp.MustCompile(`tps = ([0-9.]+)`)

func pgbench(ctx context.Context, clients int, d time.Duration, mode, script string) pgbenchResult {
	// -T counts the initial connections too (about 60 ms each here, made by
	// two threads); the tps pgbench reports excludes them, so give them time.
	secs := int(d.Seconds()) + 1 + clients*60/1000
	return runPgbench(ctx, script, "-M", mode, "-c", strconv.Itoa(clients), "-j", strconv.Itoa(min(clients, runtime.NumCPU())), "-T", strconv.Itoa(secs))
}

func pgbenchTx(ctx context.Context, clients, perClient int, script string) pgbenchResult {
	return runPgbench(ctx, script, "-M", "prepared", "-c", strconv.Itoa(clients), "-j", strconv.Itoa(min(clients, runtime.NumCPU())), "-t", strconv.Itoa(perClient))
}

func runPgbench(ctx context.Context, script string, args ...string) pgbenchResult {
	f, err := os.CreateTemp("", "bench-*.sql")
	check(err)
	defer os.Remove(f.Name())
	_, err = f.WriteString(script)
	check(err)
	f.Close()
	all := append([]string{"-n", "-f", f.Name()}, args...)
	all = append(all, *dbURL)
	cmd := exec.CommandContext(ctx, "pgbench", all...)
	outb, err := cmd.CombinedOutput()
	if err != nil {
		fail(fmt.Errorf("pgbench %v: %w\n%s", args, err, outb))
	}
	m := tpsLine.FindSubmatch(outb)
	if m == nil {
		fail(fmt.Errorf("pgbench printed no tps:\n%s", outb))
	}
	tps, _ := strconv.ParseFloat(string(m[1]), 64)
	return pgbenchResult{tps: tps}
}

func median(v []float64) float64 {
	v = slices.Clone(v)
	slices.Sort(v)
	return v[len(v)/2]
}

func pct(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, len(sorted)*p/100)]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d.Microseconds())/1000) }
func f0(v float64) string       { return fmt.Sprintf("%.0f", v) }
func ratio(a, b float64) string {
	if b == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", a/b)
}

func cpuName() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				_, v, _ := strings.Cut(l, ":")
				return strings.TrimSpace(v)
			}
		}
	}
	return runtime.GOARCH
}

func pgVersion(ctx context.Context) string {
	var v string
	check(pool0(ctx).QueryRow(ctx, "SHOW server_version").Scan(&v))
	return v
}

func pgSettings(ctx context.Context) string {
	var parts []string
	for _, s := range []string{"fsync", "synchronous_commit", "wal_sync_method", "shared_buffers", "max_connections"} {
		var v string
		check(pool0(ctx).QueryRow(ctx, "SHOW "+s).Scan(&v))
		parts = append(parts, s+"="+v)
	}
	b, _ := json.Marshal(parts)
	return strings.Trim(string(b), "[]")
}

func check(err error) {
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench:", err)
	os.Exit(1)
}
