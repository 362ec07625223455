package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stripe-inbox/inbox/internal/stripeevent"
	"github.com/stripe-inbox/inbox/internal/stripetest"
)

var (
	againstLocal = flag.String("against-local", "", "cmd/local built from another commit (scripts/bench.sh -against COMMIT builds it): the against section drains with it and with -local, alternating")
	againstRev   = flag.String("against-rev", "", "the commit -against-local was built from (for the table)")
	againstHead  = flag.String("against-head", "this tree", "what -local was built from (for the table)")
	againstN     = flag.Int("against-n", 20000, "receipts of the against section's workload (-quick: 400)")
	againstRuns  = flag.Int("against-runs", 3, "runs of each build at each concurrency in the against section; the median is reported (-quick: 1)")
)

// invoiceBacklog is the invoice-only workload of issue 24: n receipts, half
// invoice.created and half invoice.paid, one of each per invoice (the
// invoices of stripetest.Invoice: no charge, no payments list), in a
// shuffled order (the same for every seed).
func invoiceBacklog(n int) []stripeevent.Event {
	var evs []stripeevent.Event
	for i := range n / 2 {
		inv := fmt.Sprintf("in_w%d", i)
		for _, typ := range []string{"invoice.created", "invoice.paid"} {
			status := map[string]string{"invoice.created": "draft", "invoice.paid": "paid"}[typ]
			p := stripetest.Event(fmt.Sprintf("evt_w%d_%s", i, typ), typ, stripetest.Invoice(inv, "cus_1", status, 1000))
			ev, err := stripeevent.Verify(p, stripetest.Sign(p, time.Now(), secret), []string{secret})
			check(err)
			evs = append(evs, ev)
		}
	}
	r := rand.New(rand.NewPCG(3, 4))
	r.Shuffle(len(evs), func(i, j int) { evs[i], evs[j] = evs[j], evs[i] })
	return evs
}

// against drains the invoice-only workload with cmd/local's worker (one run,
// not resident) built from this tree and from another commit, alternating
// the two on the same backlog, and reports the ratio. The rate is the
// worker's own: processed receipts over its run's duration_ms, from the
// "worker run" record it logs (both builds log it), so neither the
// process's start nor its migrations check count.
func against(ctx context.Context, out io.Writer) {
	if *againstLocal == "" {
		fmt.Fprintln(out, "## 9. Against another commit")
		fmt.Fprintln(out)
		fmt.Fprintln(out, "Skipped: no -against COMMIT (scripts/bench.sh -against COMMIT).")
		fmt.Fprintln(out)
		return
	}
	n, runs := *againstN, *againstRuns
	drainers := []int{1, 4}
	if *quick {
		n, runs = 400, 1
	}
	fmt.Fprintf(out, "## 9. Against %s: %d receipts, half invoice.created, half invoice.paid (one of each per invoice, shuffled); median of %d runs each\n\n", *againstRev, n, runs)
	fmt.Fprintf(out, "cmd/local, worker only (WORKER_CONCURRENCY drainers, defaults otherwise: claims and batches of 50, not resident), built from %s and from %s, the two alternating on the same backlog, each first in turn (reset and checkpointed before each run). Rate: the run's processed receipts over its duration_ms, as the worker logs them.\n\n", *againstHead, *againstRev)
	exec0(ctx, "TRUNCATE webhook_inbox, invoices, ledger_entries, outbox, anomalies, refunds, payment_links")
	load(ctx, invoiceBacklog(n))
	theirDB := theirDatabase(ctx)
	defer exec0(context.WithoutCancel(ctx), "DROP DATABASE IF EXISTS "+theirDB.name+" WITH (FORCE)")
	var t table
	for _, d := range drainers {
		var ours, theirs, ourCPU, theirCPU, ourServer, theirServer []float64
		for r := range runs {
			// Alternating, and in turn first (ABBA...), so that neither
			// build always runs right after the backlog was loaded.
			for k := range 2 {
				if (r+k)%2 == 0 {
					resetBacklog(ctx)
					got := localDrain(*localBin, *dbURL, d, n)
					ours, ourCPU, ourServer = append(ours, got.rate), append(ourCPU, got.cpuPerReceipt), append(ourServer, got.serverPerReceipt)
				} else {
					theirDB.reset(ctx)
					got := localDrain(*againstLocal, theirDB.url, d, n)
					theirs, theirCPU, theirServer = append(theirs, got.rate), append(theirCPU, got.cpuPerReceipt), append(theirServer, got.serverPerReceipt)
				}
			}
		}
		t.add(strconv.Itoa(d), f0(median(ours)), f0(median(theirs)), ratio(median(ours), median(theirs)), rates(ours), rates(theirs),
			f0(median(ourCPU)), f0(median(theirCPU)), f0(median(ourServer)), f0(median(theirServer)))
		fmt.Fprintf(os.Stderr, "against: %d drainers: %s %v (worker CPU µs/receipt %v, server %v), %s %v (%v, %v)\n", d, *againstHead, ours, ourCPU, ourServer, *againstRev, theirs, theirCPU, theirServer)
	}
	t.print(out, "drainers", *againstHead+" receipts/s", *againstRev+" receipts/s", "ratio", *againstHead+" runs", *againstRev+" runs",
		*againstHead+" worker CPU µs/receipt", *againstRev+" worker CPU µs/receipt",
		*againstHead+" server CPU µs/receipt", *againstRev+" server CPU µs/receipt")
}

func rates(v []float64) string {
	s := make([]string, len(v))
	for i, r := range v {
		s[i] = f0(r)
	}
	return strings.Join(s, ", ")
}

// drained is one localDrain: the run's rate, and the CPU time its worker
// process (the client: decoding, the handlers' Go, pgx, logging; not
// PostgreSQL's) used per receipt from its start to the run's end, in µs.
// The two builds share the machine's cores with PostgreSQL, so a client
// that needs more CPU per receipt leaves the server less. serverPerReceipt
// is the CPU time of the server's processes (every process named postgres
// on this machine: its backends, WAL writer, checkpointer) over the same
// span, per receipt; 0 when none is visible (a server elsewhere).
type drained struct{ rate, cpuPerReceipt, serverPerReceipt float64 }

// localDrain runs bin (a cmd/local) as a worker with drainers drainers
// until its first run ends, and returns that run's rate and CPU. Every one
// of the n receipts must have been processed.
func localDrain(bin, url string, drainers, n int) drained {
	saved, savedURL := *localBin, *dbURL
	*localBin, *dbURL = bin, url
	r := startLocal(false, "LOCAL_COMPONENTS=worker", "WORKER_INTERVAL=1h", "WORKER_TIMEOUT=15m", "POLL_INTERVAL=0",
		"WORKER_CONCURRENCY="+strconv.Itoa(drainers), "LOG_LEVEL=info")
	*localBin, *dbURL = saved, savedURL
	defer r.stop()
	started, serverStarted := r.cpu(), postgresCPU() // the process's start and its migrations check: not the run's
	deadline := time.Now().Add(10 * time.Minute)
	off := 0
	for time.Now().Before(deadline) {
		// Each line once, and only the run's records decoded: the log has a
		// line per receipt, and reading it all again every 50 ms took a
		// large share of the CPUs the drain runs on.
		var lines []string
		lines, off = r.stderr.linesFrom(off)
		for _, line := range lines {
			if !strings.Contains(line, `"msg":"worker run`) {
				continue
			}
			var rec struct {
				Msg     string `json:"msg"`
				Error   string `json:"error"`
				Summary struct {
					Processed  int   `json:"processed"`
					Ignored    int   `json:"ignored"`
					Failed     int   `json:"failed"`
					DurationMs int64 `json:"duration_ms"`
				} `json:"summary"`
			}
			if json.Unmarshal([]byte(line), &rec) != nil {
				continue
			}
			switch rec.Msg {
			case "worker run failed":
				fail(fmt.Errorf("%s: worker run failed: %s", bin, rec.Error))
			case "worker run":
				s := rec.Summary
				if s.Processed+s.Ignored != n || s.Failed != 0 {
					fail(fmt.Errorf("%s: the run processed %d, ignored %d, failed %d of %d receipts", bin, s.Processed, s.Ignored, s.Failed, n))
				}
				return drained{
					rate:             float64(n) / (float64(s.DurationMs) / 1000),
					cpuPerReceipt:    float64((r.cpu() - started).Microseconds()) / float64(n),
					serverPerReceipt: float64((postgresCPU() - serverStarted).Microseconds()) / float64(n),
				}
			}
		}
		time.Sleep(50 * time.Millisecond) // polling the log of a process for its end
	}
	fail(fmt.Errorf("%s: no worker run logged in 10 minutes", bin))
	return drained{}
}

// theirDB is the other build's database: its schema is the one its own
// migrations make (a build that predates a migration cannot run on a
// database that has it: b5cb437's invoice upsert names ON CONFLICT (id),
// and migration 0017 made an invoice (id, account)), holding a copy of the
// benchmark database's backlog.
type theirDB struct {
	name, url string
	pool      *pgxpool.Pool
}

// theirDatabase creates the other build's database next to the
// benchmark's, lets the other build's cmd/local migrate it, and copies the
// backlog into it (the columns every version has).
func theirDatabase(ctx context.Context) *theirDB {
	u, err := url.Parse(*dbURL)
	check(err)
	name := strings.TrimPrefix(u.Path, "/") + "_against"
	exec0(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	exec0(ctx, "CREATE DATABASE "+name)
	u.Path = "/" + name
	db := &theirDB{name: name, url: u.String()}
	saved, savedURL := *localBin, *dbURL
	*localBin, *dbURL = *againstLocal, db.url
	startLocal(false, "LOCAL_COMPONENTS=worker", "WORKER_INTERVAL=1h", "POLL_INTERVAL=0").stop() // migrates, drains nothing
	*localBin, *dbURL = saved, savedURL
	db.pool = openURL(ctx, db.url, 2, false)
	rows, err := pool0(ctx).Query(ctx, "SELECT provider, endpoint, event_id, event_type, api_version, livemode, account, object_id, payload::text FROM webhook_inbox")
	check(err)
	recs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([]any, error) {
		v := make([]any, 9)
		ptrs := make([]any, 9)
		for i := range v {
			ptrs[i] = &v[i]
		}
		return v, r.Scan(ptrs...)
	})
	check(err)
	_, err = db.pool.CopyFrom(ctx, pgx.Identifier{"webhook_inbox"},
		[]string{"provider", "endpoint", "event_id", "event_type", "api_version", "livemode", "account", "object_id", "payload"}, pgx.CopyFromRows(recs))
	check(err)
	return db
}

// reset is resetBacklog on the other build's database: every receipt
// unprocessed, every other table of its schema emptied.
func (db *theirDB) reset(ctx context.Context) {
	var tables []string
	rows, err := db.pool.Query(ctx, "SELECT quote_ident(tablename) FROM pg_tables WHERE schemaname = 'public' AND tablename NOT IN ('webhook_inbox', 'schema_migrations')")
	check(err)
	tables, err = pgx.CollectRows(rows, pgx.RowTo[string])
	check(err)
	for _, q := range []string{
		"TRUNCATE " + strings.Join(tables, ", "),
		"UPDATE webhook_inbox SET processed_at = NULL, outcome = NULL, attempts = 0, last_error = NULL, available_at = now()",
		"VACUUM ANALYZE webhook_inbox",
	} {
		_, err := db.pool.Exec(ctx, q)
		check(err)
	}
	checkpoint(ctx)
}
