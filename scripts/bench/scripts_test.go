package main

import (
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

// TestParseCPUTimes: the machine's CPU time from /proc/stat's first line
// (the drain's "CPU busy"): guest time is not counted twice, idle is idle
// and iowait, and a text that is not /proc/stat's gives no figures.
func TestParseCPUTimes(t *testing.T) {
	stat := "cpu  100 5 50 1000 20 3 2 1 7 0\ncpu0 50 2 25 500 10 1 1 0 3 0\nintr 12345\n"
	total, idle, ok := parseCPUTimes(stat)
	if !ok || total != 1181 || idle != 1020 {
		t.Fatalf("parseCPUTimes = %d, %d, %v; want 1181, 1020, true", total, idle, ok)
	}
	for _, bad := range []string{"", "intr 1 2 3 4 5 6 7 8 9\n", "cpu 1 2 3\n", "cpu a b c d e f g h i j\n"} {
		if _, _, ok := parseCPUTimes(bad); ok {
			t.Errorf("parseCPUTimes(%q) ok, want not ok", bad)
		}
	}
}
