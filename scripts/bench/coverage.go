package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"
)

// coverage runs back-to-back resident invocations on the deployed schedule
// scaled down 20 times (a tick every 3s for 1 minute; timeout 5s for 100s;
// margin 1.5s for 30s, so each polls until 3.5s for 70s) and measures, from
// the workers' own log records ("worker resident" ... "worker resident
// stopped", each with the interval it polled), the share of wall-clock time
// with a live poller.
func coverage(ctx context.Context, out io.Writer) {
	d := 3 * time.Minute
	if *quick {
		d = 8 * time.Second // three invocations, two of them whole
	}
	fmt.Fprintln(out, "## 8. Resident worker coverage: back-to-back invocations, the deployed schedule scaled down 20×")
	fmt.Fprintln(out)
	fmt.Fprintf(out, "cmd/local worker only: WORKER_INTERVAL=3s (rate(1 minute)), WORKER_TIMEOUT=5s (workerTimeout 100s), DEADLINE_MARGIN=1500ms (30s), "+
		"STATEMENT_TIMEOUT=500ms, POLL_INTERVAL=250ms, LISTEN=on, for %s (%d invocations; %s at the real scale). "+
		"Each invocation logs the interval it was resident; coverage is the union of those intervals over the run's span.\n\n",
		d, int(d/(3*time.Second)), d*20)
	exec0(ctx, "TRUNCATE webhook_inbox, invoices, ledger_entries, outbox, anomalies, refunds, payment_links")
	r := startLocal(false, "LOCAL_COMPONENTS=worker", "WORKER_INTERVAL=3s", "WORKER_TIMEOUT=5s", "DEADLINE_MARGIN=1500ms",
		"STATEMENT_TIMEOUT=500ms", "POLL_INTERVAL=250ms", "LISTEN=on", "LOG_LEVEL=info")
	time.Sleep(d) // the run under observation: the duration is the experiment, not a stand-in for a state
	r.stop()

	type span struct{ from, until time.Time }
	var spans []span
	for _, line := range strings.Split(r.stderr.String(), "\n") {
		var rec struct {
			Msg   string    `json:"msg"`
			From  time.Time `json:"resident_from"`
			Until time.Time `json:"resident_until"`
		}
		if json.Unmarshal([]byte(line), &rec) != nil || rec.Msg != "worker resident stopped" {
			continue
		}
		spans = append(spans, span{rec.From, rec.Until})
	}
	if len(spans) < 2 {
		fail(fmt.Errorf("coverage: %d resident intervals logged:\n%s", len(spans), r.stderr.String()))
	}
	slices.SortFunc(spans, func(a, b span) int { return a.from.Compare(b.from) })
	start, end := spans[0].from, spans[0].until
	for _, s := range spans {
		end = later(end, s.until)
	}
	// The invocations running at the stop were cut short by it: the window
	// ends there, and their overlap says nothing about the schedule.
	cut := func(s span) bool { return end.Sub(s.until) < 100*time.Millisecond }
	var covered, largestGap time.Duration
	minOverlap := time.Duration(1<<63 - 1)
	cur := spans[0]
	for i, s := range spans[1:] {
		if prev := spans[i]; !cut(prev) {
			minOverlap = min(minOverlap, prev.until.Sub(s.from)) // negative: a gap
		}
		if s.from.After(cur.until) {
			covered += cur.until.Sub(cur.from)
			largestGap = max(largestGap, s.from.Sub(cur.until))
			cur = s
			continue
		}
		cur.until = later(cur.until, s.until)
	}
	covered += cur.until.Sub(cur.from)
	share := covered.Seconds() / end.Sub(start).Seconds()
	var t table
	t.add(fmt.Sprint(len(spans)), end.Sub(start).Round(time.Millisecond).String(), fmt.Sprintf("%.4f%%", 100*share),
		largestGap.Round(time.Millisecond).String(), minOverlap.Round(time.Millisecond).String())
	t.print(out, "invocations", "span", "time with a live poller", "largest gap", "smallest overlap (negative: a gap)")
	fmt.Fprintf(os.Stderr, "coverage: %d invocations, %.4f%% with a live poller, largest gap %s\n", len(spans), 100*share, largestGap)
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
