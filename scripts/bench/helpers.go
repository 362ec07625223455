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

// openURL opens a pool of conns connections to url, with the worker's
// statement cache when prepared (config.LoadWorker), else as the webhook's.
func openURL(ctx context.Context, url string, conns int32, prepared bool) *pgxpool.Pool {
	p, err := database.Open(ctx, database.Config{URL: url, MaxConns: conns, PreparedStatements: prepared}, nil)
	check(err)
	return p
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

func pgbenchOn(ctx context.Context, url string, clients int, d time.Duration, mode, script string) pgbenchResult {
	// -T counts the initial connections too (about 60 ms each here, made by
	// two threads); the tps pgbench reports excludes them, so give them time.
	secs := int(d.Seconds()) + 1 + clients*60/1000
	return runPgbenchOn(ctx, url, script, "-M", mode, "-c", strconv.Itoa(clients), "-j", strconv.Itoa(min(clients, runtime.NumCPU())), "-T", strconv.Itoa(secs))
}

func pgbenchTx(ctx context.Context, url string, clients, perClient int, script string) pgbenchResult {
	return runPgbenchOn(ctx, url, script, "-M", "prepared", "-c", strconv.Itoa(clients), "-j", strconv.Itoa(min(clients, runtime.NumCPU())), "-t", strconv.Itoa(perClient))
}

func runPgbenchOn(ctx context.Context, url, script string, args ...string) pgbenchResult {
	f, err := os.CreateTemp("", "bench-*.sql")
	check(err)
	defer os.Remove(f.Name())
	_, err = f.WriteString(script)
	check(err)
	f.Close()
	all := append([]string{"-n", "-f", f.Name()}, args...)
	all = append(all, url)
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

var param = regexp.MustCompile(`\$([0-9]+)`)

// pgbenchSQL is sql (a statement of the packages, with $1, $2, ...
// parameters) with args[n-1] in place of each $n: pgbench variables
// (:name) or literals. pgbench then sends the variables as parameters of a
// prepared statement (-M prepared), as pgx does. It panics when a parameter
// has no argument or an argument no parameter: the statement changed, and
// the script must follow it (TestPgbenchScriptsFitTheStatements).
//
// A colon in a string literal of sql that pgbench would take for a
// variable (':' then a letter, digit or '_', as in
// 'inbox:customer_metadata:', issue 28's idempotency key) is written as
// chr(58): pgbench replaces :name with a parameter even inside a literal,
// and the prepared statement then fails ("could not determine data type of
// parameter $6").
func pgbenchSQL(sql string, args ...string) string {
	sql = literal.ReplaceAllStringFunc(sql, func(lit string) string {
		if !pgbenchVariable.MatchString(lit) {
			return lit
		}
		parts := strings.Split(lit[1:len(lit)-1], ":")
		return "('" + strings.Join(parts, "' || chr(58) || '") + "')"
	})
	used := make([]bool, len(args))
	out := param.ReplaceAllStringFunc(sql, func(m string) string {
		n, _ := strconv.Atoi(m[1:])
		if n < 1 || n > len(args) {
			panic(fmt.Sprintf("pgbenchSQL: $%d without an argument (%d given) in %s", n, len(args), sql))
		}
		used[n-1] = true
		return args[n-1]
	})
	for i, u := range used {
		if !u {
			panic(fmt.Sprintf("pgbenchSQL: argument %d (%s) for no parameter in %s", i+1, args[i], sql))
		}
	}
	return out
}

var (
	literal         = regexp.MustCompile(`'(?:[^']|'')*'`)
	pgbenchVariable = regexp.MustCompile(`:[A-Za-z0-9_]`)
)

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

// checkpoint starts a timed run right after a checkpoint, so that none of
// them pays for (or escapes) a checkpoint and its full-page writes by
// chance. A smoke run (-quick) judges no figure and skips it: on a busy
// disk a checkpoint takes seconds.
func checkpoint(ctx context.Context) {
	if !*quick {
		exec0(ctx, "CHECKPOINT")
	}
}

// cpuTime is CPU time spent so far, in clock ticks, from a cpu line of
// /proc/stat (proc(5)): all of it, and the part spent idle (idle and
// iowait). Guest time is counted in user time already, so only the first
// eight fields (user to steal) are summed. Steal, time the hypervisor gave
// another guest, counts as busy: this machine could not use it. In a
// container /proc/stat is the host's.
type cpuTime struct{ total, idle int64 }

// readCPU is /proc/stat's cpu lines by name: "cpu" (every CPU) and "cpu0",
// "cpu1" and so on. It is nil where /proc/stat cannot be read.
func readCPU() map[string]cpuTime {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return nil
	}
	return parseCPU(string(b))
}

// parseCPU reads readCPU's figures from the text of /proc/stat. A cpu line
// that is not user nice system idle iowait irq softirq steal (and guest
// time) in numbers is left out.
func parseCPU(stat string) map[string]cpuTime {
	out := map[string]cpuTime{}
	for _, line := range strings.Split(stat, "\n") {
		f := strings.Fields(line)
		if len(f) < 9 || !strings.HasPrefix(f[0], "cpu") {
			continue
		}
		var t cpuTime
		ok := true
		for i, s := range f[1:9] {
			v, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				ok = false
				break
			}
			t.total += v
			if i == 3 || i == 4 {
				t.idle += v
			}
		}
		if ok {
			out[f[0]] = t
		}
	}
	return out
}

// busyShare is the share of the CPU time between two readings that was
// not idle, 0 to 1, or -1 when the readings make no sense together: no
// time passed, or the idle time went backwards or past the total (proc(5):
// iowait can decrease).
func busyShare(before, after cpuTime) float64 {
	total, idle := after.total-before.total, after.idle-before.idle
	if total <= 0 || idle < 0 || idle > total {
		return -1
	}
	return 1 - float64(idle)/float64(total)
}

// cpuBusy is how busy the machine's CPUs were while something ran: all of
// them together and each one (busyShare; -1 where /proc/stat could not be
// read).
type cpuBusy struct {
	all float64
	per map[string]float64 // by /proc/stat's name: "cpu0", "cpu1", ...
}

// measureBusy runs fn and returns how busy the CPUs were meanwhile. Near
// 1 for the CPUs a drain runs on, those cores are what limits it: more
// drainers can gain only by lowering the CPU a receipt costs.
func measureBusy(fn func()) cpuBusy {
	before := readCPU()
	fn()
	after := readCPU()
	b := cpuBusy{all: -1, per: map[string]float64{}}
	for name, t0 := range before {
		t1, ok := after[name]
		if !ok {
			continue
		}
		if name == "cpu" {
			b.all = busyShare(t0, t1)
		} else {
			b.per[name] = busyShare(t0, t1)
		}
	}
	return b
}

// label prints b for a section's table: the whole machine's share, or,
// pinned, PostgreSQL's CPU and the benchmark's (pin.go), since a saturated
// server CPU beside a half-idle client CPU reads as three quarters overall.
func (b cpuBusy) label(pinned bool) string {
	if !pinned {
		return share(b.all)
	}
	server, ok1 := b.per["cpu"+serverCPU]
	client, ok2 := b.per["cpu"+clientCPU]
	if !ok1 || !ok2 {
		return "n/a"
	}
	return "server " + share(server) + ", client " + share(client)
}

// share prints a share from busyShare as a percentage.
func share(v float64) string {
	if v < 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.0f %%", 100*v)
}
