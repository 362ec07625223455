package main

import (
	"maps"
	"strings"
	"testing"
)

// TestPgbenchScriptsFitTheStatements renders every pgbench script the bench
// runs from the packages' own statements (internal/benchsql): a statement
// that gained or lost a parameter fails here, in the test command, instead
// of at the start of a benchmark section (issue 24: the receipts section
// once stopped with "$11 without an argument").
func TestPgbenchScriptsFitTheStatements(t *testing.T) {
	t.Parallel()
	for name, script := range map[string]func() string{
		"receipts (storeScript)": storeScript,
		"drain (drainScript)":    drainScript,
	} {
		s := script()
		if strings.Contains(s, "$") {
			t.Errorf("%s: a parameter left in the script:\n%s", name, s)
		}
		for _, lit := range literal.FindAllString(s, -1) {
			if pgbenchVariable.MatchString(lit) {
				t.Errorf("%s: pgbench would read a variable in the literal %s", name, lit)
			}
		}
	}
}

func TestPgbenchSQLRefusesAParameterWithoutArgumentAndAnArgumentWithoutParameter(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		sql  string
		args []string
		want string
	}{
		{"SELECT $1, $2", []string{"1"}, "$2 without an argument"},
		{"SELECT $1", []string{"1", "2"}, "argument 2 (2) for no parameter"},
	} {
		func() {
			defer func() {
				msg, _ := recover().(string)
				if !strings.Contains(msg, tc.want) {
					t.Errorf("pgbenchSQL(%q, %q) panicked with %q, want %q", tc.sql, tc.args, msg, tc.want)
				}
			}()
			pgbenchSQL(tc.sql, tc.args...)
		}()
	}
	if got := pgbenchSQL("SELECT $1, $2, $1", ":a", "'b'"); got != "SELECT :a, 'b', :a" {
		t.Errorf("got %q", got)
	}
	if got := pgbenchSQL("SELECT 'k:v:' || $1, '{\"a\": 1}'", ":a"); got != "SELECT ('k' || chr(58) || 'v' || chr(58) || '') || :a, '{\"a\": 1}'" {
		t.Errorf("got %q", got)
	}
}

// The runner prints the webhook's endpoint lines and then the /_eventbridge
// line (cmd/local): the webhook's URL is the endpoint's, not the last line's.
func TestNoteListeningTellsTheRoutesApart(t *testing.T) {
	t.Parallel()
	var r localRunner
	for _, l := range []string{
		`listening on http://127.0.0.1:41234/billing (endpoint "billing")`,
		`listening on http://127.0.0.1:41234/_eventbridge (EventBridge: sources aws.partner/stripe.com/* to endpoint "billing")`,
		`worker running every 2s`,
	} {
		r.noteListening(l)
	}
	if r.url != "http://127.0.0.1:41234/billing" || r.ebURL != "http://127.0.0.1:41234/_eventbridge" {
		t.Errorf("url %q, ebURL %q", r.url, r.ebURL)
	}
}

// TestParseCPU: the CPU time of the machine and of each CPU from
// /proc/stat's cpu lines (the drain's "CPU busy"): guest time is not
// counted twice, idle is idle and iowait, and a line that is not a cpu
// line of numbers gives nothing.
func TestParseCPU(t *testing.T) {
	stat := "cpu  100 5 50 1000 20 3 2 1 7 0\ncpu0 60 2 25 400 10 1 1 1 3 0\ncpu1 40 3 25 600 10 2 1 0 4 0\n" +
		"cpu2 1 2 3\ncpu3 a b c d e f g h i j\nintr 1 2 3 4 5 6 7 8 9\n"
	got := parseCPU(stat)
	want := map[string]cpuTime{"cpu": {1181, 1020}, "cpu0": {500, 410}, "cpu1": {681, 610}}
	if !maps.Equal(got, want) {
		t.Fatalf("parseCPU = %v; want %v", got, want)
	}
	if got := parseCPU(""); len(got) != 0 {
		t.Errorf("parseCPU(\"\") = %v; want nothing", got)
	}
}

// TestBusyShare: the share of the time between two readings that was not
// idle, and -1 for readings that make no sense together.
func TestBusyShare(t *testing.T) {
	for _, c := range []struct {
		before, after cpuTime
		want          float64
	}{
		{cpuTime{1000, 800}, cpuTime{1200, 850}, 0.75},
		{cpuTime{1000, 800}, cpuTime{1200, 1000}, 0},
		{cpuTime{1000, 800}, cpuTime{1200, 800}, 1},
		{cpuTime{1000, 800}, cpuTime{1000, 800}, -1},  // no time passed
		{cpuTime{1000, 800}, cpuTime{1200, 790}, -1},  // idle went backwards
		{cpuTime{1000, 800}, cpuTime{1200, 1100}, -1}, // more idle than time
	} {
		if got := busyShare(c.before, c.after); got != c.want {
			t.Errorf("busyShare(%v, %v) = %v; want %v", c.before, c.after, got, c.want)
		}
	}
	if got := (cpuBusy{all: 0.5, per: map[string]float64{"cpu0": 0.98, "cpu1": 0.5}}).label(true); got != "server 98 %, client 50 %" {
		t.Errorf("pinned label = %q", got)
	}
	if got := (cpuBusy{all: -1}).label(false); got != "n/a" {
		t.Errorf("unreadable label = %q; want n/a", got)
	}
}
