package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stripe-inbox/inbox/internal/benchsql"
	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/stripeevent"
	"github.com/stripe-inbox/inbox/internal/stripetest"
	"github.com/stripe-inbox/inbox/internal/worker"
)

// backlog generates n receipts of invoice lifecycles (every story of the
// one generator, internal/stripetest: snapshots, payments, refunds that
// succeed, fail or are canceled, PaymentIntent payments) with duplicates
// and separate Event objects for one fact, in test mode as the bench's
// worker books; the same seed gives the same events.
//
// The refund stories are what once made concurrent batched drainers
// deadlock again and again (2026-12-03: 122 deadlocks in 70 s, a 600-receipt
// drain at 4 drainers not done in 8 minutes); see splitUnplaced in
// internal/worker/apply.go.
func backlog(n int) []stripeevent.Event {
	g := stripetest.NewGenerator(rand.New(rand.NewPCG(1, 2)), stripetest.Options{Prefix: "b", TwinRate: 0.1})
	var evs []stripeevent.Event
	for len(evs) < n {
		for _, ge := range g.Shuffled(max(1, (n-len(evs))/6)) { // about 6 events per lifecycle
			ev, err := stripeevent.Verify(ge.Payload, stripetest.Sign(ge.Payload, time.Now(), secret), []string{secret})
			check(err)
			evs = append(evs, ev)
		}
	}
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
	exec0(ctx, "TRUNCATE invoices, ledger_entries, outbox, anomalies, refunds, payment_links")
	exec0(ctx, "UPDATE webhook_inbox SET processed_at = NULL, outcome = NULL, attempts = 0, last_error = NULL, available_at = now()")
	exec0(ctx, "VACUUM ANALYZE webhook_inbox")
	// Every timed run starts right after a checkpoint, so that none of them
	// pays for (or escapes) a checkpoint and its full-page writes by chance.
	checkpoint(ctx)
}

func runWorker(ctx context.Context, drainers, batch int) workerRun {
	return runWorkerOn(ctx, *dbURL, drainers, batch)
}

// workerRun is one run of the worker over a backlog: what it did, how long it
// took, and how busy the CPUs were meanwhile (measureBusy).
type workerRun struct {
	worker.Summary
	took    time.Duration
	cpuBusy cpuBusy
}

// rate is the run's receipts a second.
func (r workerRun) rate() float64 { return float64(r.Processed+r.Ignored) / r.took.Seconds() }

// runWorkerOn runs the worker until the inbox is drained, its pool
// connected to url.
func runWorkerOn(ctx context.Context, url string, drainers, batch int) workerRun {
	pool := openURL(ctx, url, int32(drainers+1), true)
	defer pool.Close()
	// The worker's defaults (claims of worker.DefaultClaimLimit), with the
	// batch size given; 0 is the default batch.
	cfg := worker.Config{Mode: worker.ModeTest, Concurrency: drainers, BatchSize: batch}.WithDefaults()
	check(cfg.Validate())
	w, err := worker.New(pool, handlers.Default(), cfg, quiet, nil)
	check(err)
	warm(ctx, pool)
	var r workerRun
	r.cpuBusy = measureBusy(func() {
		start := time.Now()
		r.Summary, err = w.Run(ctx)
		r.took = time.Since(start)
	})
	check(err)
	return r
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
	n, runs, drainers := 6000, 3, []int{1, 4, 8}
	if *quick {
		n, runs, drainers = 200, 1, []int{4}
	}
	fmt.Fprintf(out, "## 2. Drain: %d receipts (invoice lifecycles with refunds, duplicates, separate Event objects); median of %d runs\n\n", n, runs)
	fmt.Fprintln(out, "Limit: pgbench running the seed's per-row transactions with the packages' SQL (the worker's claim of one row in its own transaction, then statement timeout, lock, invoice.paid's statement, mark processed, commit) at the same concurrency over a backlog of invoice.paid receipts.")
	fmt.Fprintln(out)
	fmt.Fprintln(out, "CPU busy: the share of the CPU time that was not idle during the batched run whose rate is the median (/proc/stat): the whole machine's, or pinned, PostgreSQL's CPU and the benchmark's. Near 100 % for the CPUs the drain runs on, the cores are what limits it: more drainers can gain only by lowering the CPU a receipt costs. The figure counts every process on the machine, the benchmark's own included, and iowait as idle; a run of a second or less can be off by several points.")
	fmt.Fprintln(out)
	exec0(ctx, "TRUNCATE webhook_inbox, invoices, ledger_entries, outbox, anomalies, refunds, payment_links")
	load(ctx, backlog(n))
	var t table
	for _, d := range drainers {
		for _, pinned := range cpuModes() {
			withCPUs(ctx, pinned, func() {
				// Median of three runs each, interleaved, so that a burst of
				// noise on a shared machine does not decide the ratio.
				var rates1, limits []float64
				var batched []workerRun
				for range runs {
					resetBacklog(ctx)
					rates1 = append(rates1, runWorker(ctx, d, 1).rate())
					resetBacklog(ctx)
					batched = append(batched, runWorker(ctx, d, 0))
					limits = append(limits, pgbenchDrain(ctx, *dbURL, d, n))
				}
				// The batched run whose rate is the median, with its CPU.
				slices.SortFunc(batched, func(a, b workerRun) int { return cmp.Compare(a.rate(), b.rate()) })
				mid := batched[len(batched)/2]
				rate1, rate10, limit := median(rates1), mid.rate(), median(limits)
				t.add(strconv.Itoa(d), cpuLabel(pinned), f0(rate1), f0(rate10), ratio(rate10, rate1), f0(limit), ratio(rate1, limit), ratio(rate10, limit),
					mid.cpuBusy.label(pinned), fmt.Sprintf("%d+%d", mid.Processed, mid.Ignored))
			})
		}
	}
	t.print(out, "drainers", "CPUs", "per-row receipts/s (batch 1)", fmt.Sprintf("batched receipts/s (batch %d)", worker.DefaultBatchSize), "batched/per-row", "pgbench per-row tps (limit)", "per-row/limit", "batched/limit", "CPU busy (batched)", "processed")
}

// pgbenchDrain loads n invoice.paid receipts under endpoint 'pgbench' and
// lets pgbench drain them through url with the seed's two transactions per
// row (see drainScript). Every other receipt must be processed: the claim
// is the worker's.
func pgbenchDrain(ctx context.Context, url string, clients, n int) float64 {
	exec0(ctx, "TRUNCATE invoices, ledger_entries, outbox, refunds, payment_links")
	exec0(ctx, "DELETE FROM webhook_inbox WHERE endpoint = 'pgbench'")
	per := n / clients
	total := per * clients
	exec0(ctx, `INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, object_id, payload)
		SELECT 'stripe', 'pgbench', 'evt_pb_' || g, 'invoice.paid', false, 'in_pb_' || g, $1::jsonb
		  FROM generate_series(1, $2) g`, string(samplePayload("evt_pb")), total)
	exec0(ctx, "VACUUM ANALYZE webhook_inbox")
	checkpoint(ctx) // as resetBacklog does before the worker's runs
	res := pgbenchTx(ctx, url, clients, per, drainScript())
	left := count(ctx, "SELECT count(*) FROM webhook_inbox WHERE endpoint = 'pgbench' AND processed_at IS NULL")
	if left != 0 {
		fail(fmt.Errorf("pgbench drain left %d rows", left))
	}
	exec0(ctx, "DELETE FROM webhook_inbox WHERE endpoint = 'pgbench'")
	return res.tps
}

// drainScript is the pgbench script of the drain's limit: the seed's two
// transactions per receipt, with the packages' statements: the worker's
// claim of one receipt (benchsql.ClaimSQL, its own transaction, committed
// without waiting for its WAL flush as the worker's is), then the
// statement timeout, the lock, invoice.paid's statement in the common case
// (benchsql.PayInvoiceSQL) and the mark, and the commit.
func drainScript() string {
	timeout := fmt.Sprintf("'%dms'", worker.DefaultStatementTimeout.Milliseconds())
	// The claim returns provider, endpoint, event_id, event_type,
	// coalesce (the object id), attempts: \gset makes them variables.
	// The claim's own transaction, as inbox.Claim sends it in one pipeline
	// (here four round trips: pgbench's \gset does not work in a pipeline).
	// invoice.paid's $13 to $16: no payments, 1000 through Stripe, none
	// outside it (no out-of-band payload).
	return `BEGIN;
` + benchsql.ClaimLocalsSQL + `;
` + pgbenchSQL(benchsql.ClaimSQL, "NULL", strconv.Itoa(worker.DefaultMaxAttempts), "120000") + ` \gset
COMMIT;
BEGIN;
` + pgbenchSQL(benchsql.SetLocalStatementTimeoutSQL, timeout) + `;
` + pgbenchSQL(benchsql.LockSQL, ":provider", ":endpoint", ":event_id") + `;
` + pgbenchSQL(benchsql.PayInvoiceSQL, ":coalesce", "'cus_1'", "'paid'", "'usd'", "1000", "1000", "'"+benchsql.PaidFrom+"'",
		"1700000000", strconv.Itoa(int(benchsql.PaidRank)), ":event_id", "NULL", // $11 the platform's own account
		`'{"invoice_id": "in", "customer_id": "cus_1", "amount": 1000, "currency": "usd"}'`,
		"'{}'", "1000", "0", "NULL") + `;
` + pgbenchSQL(benchsql.MarkProcessedSQL, ":provider", ":endpoint", ":event_id", "'applied'", "NULL") + `;
COMMIT;
`
}
