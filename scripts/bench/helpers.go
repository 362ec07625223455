package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stripe-inbox/inbox/internal/database"
)

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
