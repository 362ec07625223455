// Command bench measures the receipt path, the drain, scale and purge against
// limits measured in the same run (pgbench doing the same SQL), and prints a
// markdown table. scripts/bench.sh runs it; see that script for the set-up.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stripe-inbox/inbox/internal/config"
	"github.com/stripe-inbox/inbox/internal/migrate"
)

const secret = "whsec_bench"

var (
	dbURL     = flag.String("db", "", "URL of the benchmark database (created and migrated by scripts/bench.sh)")
	quick     = flag.Bool("quick", false, "smaller sizes (a smoke run)")
	coldStart = flag.String("coldstart", "", "file with cold-start figures from the e2e suite (E2E_REPORT), if any")
	only      = flag.String("only", "", "comma-separated sections to run (receipts,drain,rtt,scale,purge,cold,needsreview,latency,coverage,ingest,against); default all")
	localBin  = flag.String("local", ".tmp/local", "the cmd/local binary (latency, coverage and ingest run it as a process; scripts/bench.sh builds it)")
	cpuprof   = flag.String("cpuprofile", "", "write a CPU profile of this process to the file")
	pin       = flag.Bool("pin", false, "receipts, drain and rtt also run with PostgreSQL pinned to CPU 0 and the benchmark to CPU 1 (see pin.go); needs 2 cores and a server of its own")
	toxiAPI   = flag.String("toxiproxy", "", "toxiproxy's API URL (rtt: scripts/bench.sh starts it)")
	toxiProxy = flag.String("toxiproxy-proxy", "", "name of the toxiproxy proxy in front of the benchmark's PostgreSQL")
	toxiPort  = flag.Int("toxiproxy-port", 0, "the port that proxy listens on (127.0.0.1)")

	toxiproxyPid = flag.Int("toxiproxy-pid", 0, "toxiproxy's process, pinned with the benchmark")
	quiet        = slog.New(slog.NewTextHandler(io.Discard, nil))
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
	// The sections that drain in this process (drain, rtt, scale) run the
	// worker with the collector's target bootstrap.NewWorker gives it when
	// deployed (config.GC), unless GOGC is set.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(config.WorkerGCPercent)
	}
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
	fmt.Fprintf(out, "Load average at the start: %s (the machine may be shared: compare ratios, each measured against a limit in the same run)\n\n", loadAvg())
	if modes := cpuModes(); modes[0] {
		fmt.Fprintln(out, "CPU pinning: receipts, drain and rtt run twice. *pinned*: PostgreSQL's processes on CPU 0, the benchmark (with its pgbench and toxiproxy) on CPU 1 (taskset); *shared*: every process on both CPUs.")
	} else {
		fmt.Fprintln(out, "CPU pinning: off (BENCH_PIN=0, fewer than 2 cores, or a server the benchmark does not own): every process shares every CPU.")
	}
	fmt.Fprintln(out)

	for _, sec := range []struct {
		name string
		run  func(io.Writer)
	}{
		{"receipts", func(out io.Writer) { receipts(ctx, out) }},
		{"drain", func(out io.Writer) { drain(ctx, out) }},
		{"rtt", func(out io.Writer) { rtt(ctx, out) }},
		{"scale", func(out io.Writer) { scale(ctx, out) }},
		{"purge", func(out io.Writer) { purge(ctx, out) }},
		{"cold", func(out io.Writer) { cold(out) }},
		{"needsreview", func(out io.Writer) { needsReview(ctx, out) }},
		{"latency", func(out io.Writer) { latency(ctx, out) }},
		{"coverage", func(out io.Writer) { coverage(ctx, out) }},
		{"against", func(out io.Writer) { against(ctx, out) }},
		{"ingest", func(out io.Writer) { ingest(ctx, out) }},
	} {
		if *only == "" || slices.Contains(strings.Split(*only, ","), sec.name) {
			var buf bytes.Buffer
			t0 := time.Now()
			sec.run(&buf)
			fmt.Fprintf(os.Stderr, "section %s: %s\n", sec.name, time.Since(t0).Round(100*time.Millisecond))
			_, err := out.Write(buf.Bytes())
			check(err)
			if *quick {
				check(printedFigures(sec.name, buf.String()))
			}
		}
	}
}

// printedFigures is the smoke run's check of a section (-quick): it ran to
// its end (it returned; a failure exits the bench) and printed a table with
// at least one row of figures. It says nothing about the figures
// themselves: no test depends on speed. A section that has nothing to
// measure here says so instead: rtt without toxiproxy, cold without the e2e
// suite's report, against without another commit.
func printedFigures(name, text string) error {
	if strings.Contains(text, "\nSkipped: ") || strings.Contains(text, "\nNo cold-start report") {
		return nil
	}
	rows := 0
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "| ") && !strings.HasPrefix(l, "| ---") {
			rows++
		}
	}
	if rows < 2 { // a header and a row
		return fmt.Errorf("section %s printed no table of figures:\n%s", name, text)
	}
	return nil
}
