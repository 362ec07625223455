package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/stripe-inbox/inbox/internal/stripeevent"
	"github.com/stripe-inbox/inbox/internal/stripetest"
)

// localRunner is a running cmd/local.
type localRunner struct {
	cmd    *exec.Cmd
	stdout *bytes.Buffer // its printed lines
	stderr *lockedBuffer // its JSON log
	url    string        // the webhook's URL, when it runs one
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

var listeningLine = regexp.MustCompile(`listening on (http://\S+) `)

// startLocal starts cmd/local with env (on top of a clean environment: PATH
// and HOME only) and waits for its worker to start and, with webhook, for
// its webhook to listen.
func startLocal(webhook bool, env ...string) *localRunner {
	cmd := exec.Command(*localBin)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"),
		"DATABASE_URL=" + *dbURL, "STRIPE_WEBHOOK_SECRET=" + secret, "WEBHOOK_ENDPOINT=billing",
		"STRIPE_MODE=test", "LISTEN_ADDR=127.0.0.1:0"}, env...)
	stdout, err := cmd.StdoutPipe()
	check(err)
	r := &localRunner{cmd: cmd, stdout: &bytes.Buffer{}, stderr: &lockedBuffer{}}
	cmd.Stderr = r.stderr
	check(cmd.Start())
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	timeout := time.After(60 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				fail(fmt.Errorf("cmd/local exited:\n%s", r.stderr.String()))
			}
			r.stdout.WriteString(l + "\n")
			if m := listeningLine.FindStringSubmatch(l); m != nil {
				r.url = m[1]
			}
			if strings.HasPrefix(l, "worker running") && (!webhook || r.url != "") {
				go func() { // keep the pipe drained
					for range lines {
					}
				}()
				return r
			}
		case <-timeout:
			fail(fmt.Errorf("cmd/local did not start:\n%s%s", r.stdout, r.stderr.String()))
		}
	}
}

func (r *localRunner) stop() {
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	// The exit status of a runner stopped on purpose tells nothing.
	done := make(chan struct{})
	go func() { _ = r.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = r.cmd.Process.Kill()
		<-done
	}
}

// ----------------------------------------------------------------- latency

// latencyMode is one way of running the worker in the latency section.
type latencyMode struct {
	name string
	env  []string
}

// latency streams the invoice lifecycle mix at a steady rate through the
// local runner's webhook (HTTP, signature, INSERT) and measures
// receipt-to-effect (processed_at - received_at) for each receipt, with the
// worker resident (woken by NOTIFY, or polling only) and scheduled-only with
// one run a minute (the local runner standing in for the schedule).
func latency(ctx context.Context, out io.Writer) {
	dur := 60 * time.Second
	if *quick {
		dur = 10 * time.Second
	}
	fmt.Fprintln(out, "## 7. Receipt to effect: a steady stream through the webhook, resident worker vs one run a minute")
	fmt.Fprintln(out)
	fmt.Fprintf(out, "cmd/local (webhook + worker, one process, defaults otherwise: 4 drainers, batches of 50) with WORKER_INTERVAL=60s "+
		"(the deployed cadence); the invoice lifecycle mix (created, finalized, paid or voided, second Event objects, refunds; shuffled) "+
		"signed and POSTed at a steady rate for %s; latency is processed_at - received_at of every receipt, read from the table once all are processed.\n\n", dur)
	modes := []latencyMode{
		{"resident, NOTIFY/LISTEN (local default)", []string{"POLL_INTERVAL=250ms", "LISTEN=on", "NOTIFY=on"}},
		{"resident, polling every 250ms only (stack default)", []string{"POLL_INTERVAL=250ms", "LISTEN=off", "NOTIFY=off"}},
		{"scheduled only, one run a minute", []string{"POLL_INTERVAL=0", "LISTEN=off", "NOTIFY=off"}},
	}
	var t table
	for _, rate := range []int{50, 500} {
		for _, m := range modes {
			exec0(ctx, "TRUNCATE webhook_inbox, invoices, ledger_entries, outbox, anomalies")
			exec0(ctx, "CHECKPOINT")
			r := startLocal(true, append([]string{"LOCAL_COMPONENTS=webhook,worker", "WORKER_INTERVAL=60s", "LOG_LEVEL=warn"}, m.env...)...)
			sent, failed, achieved := stream(ctx, r.url, rate, dur)
			drained := waitDrained(ctx, 4*time.Minute)
			r.stop()
			var n int64
			var p50, p99, mx float64
			check(pool0(ctx).QueryRow(ctx, `
SELECT count(*),
       coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY l), 0),
       coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY l), 0),
       coalesce(max(l), 0)
  FROM (SELECT extract(epoch FROM processed_at - received_at) * 1000 AS l
          FROM webhook_inbox WHERE processed_at IS NOT NULL) AS x`).Scan(&n, &p50, &p99, &mx))
			note := ""
			if !drained {
				note = " (not drained!)"
			}
			t.add(fmt.Sprint(rate), m.name, fmt.Sprintf("%d/%d%s", n, sent-failed, note), f0(achieved),
				fmt.Sprintf("%.0f", p50), fmt.Sprintf("%.0f", p99), fmt.Sprintf("%.0f", mx))
			fmt.Fprintf(os.Stderr, "latency: %d/s %s: p50 %.0f ms p99 %.0f ms max %.0f ms\n", rate, m.name, p50, p99, mx)
		}
	}
	t.print(out, "events/s", "worker", "receipts processed / stored", "sent/s", "p50 ms", "p99 ms", "max ms")
}

// stream POSTs events at rate per second for d, and returns how many it
// sent, how many were not answered 2xx, and the rate it achieved.
func stream(ctx context.Context, url string, rate int, d time.Duration) (sent, failed int64, achieved float64) {
	evs := backlog(int(float64(rate) * d.Seconds()))
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	ch := make(chan stripeevent.Event, 1024)
	var nSent, nFailed atomic.Int64
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ev := range ch {
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(ev.Payload))
				check(err)
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Stripe-Signature", stripetest.Sign(ev.Payload, time.Now(), secret))
				resp, err := client.Do(req)
				nSent.Add(1)
				if err != nil {
					nFailed.Add(1)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					nFailed.Add(1)
				}
			}
		}()
	}
	start := time.Now()
	for i, ev := range evs {
		if wait := time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate))); wait > 0 {
			time.Sleep(wait)
		}
		ch <- ev
	}
	close(ch)
	wg.Wait()
	return nSent.Load(), nFailed.Load(), float64(nSent.Load()) / time.Since(start).Seconds()
}

// waitDrained waits until no receipt is unprocessed (at most max), and
// reports whether that happened.
func waitDrained(ctx context.Context, max time.Duration) bool {
	deadline := time.Now().Add(max)
	for time.Now().Before(deadline) {
		if count(ctx, "SELECT count(*) FROM webhook_inbox WHERE processed_at IS NULL") == 0 {
			return true
		}
		time.Sleep(200 * time.Millisecond)
	}
	return false
}

// ---------------------------------------------------------------- coverage

// coverage runs back-to-back resident invocations on the deployed schedule
// scaled down 20 times (a tick every 3s for 1 minute; timeout 5s for 100s;
// margin 1.5s for 30s, so each polls until 3.5s for 70s) and measures, from
// the workers' own log records ("worker resident" ... "worker resident
// stopped", each with the interval it polled), the share of wall-clock time
// with a live poller.
func coverage(ctx context.Context, out io.Writer) {
	d := 3 * time.Minute
	if *quick {
		d = 30 * time.Second
	}
	fmt.Fprintln(out, "## 8. Resident worker coverage: back-to-back invocations, the deployed schedule scaled down 20×")
	fmt.Fprintln(out)
	fmt.Fprintf(out, "cmd/local worker only: WORKER_INTERVAL=3s (rate(1 minute)), WORKER_TIMEOUT=5s (workerTimeout 100s), DEADLINE_MARGIN=1500ms (30s), "+
		"STATEMENT_TIMEOUT=500ms, POLL_INTERVAL=250ms, LISTEN=on, for %s (%d invocations; %s at the real scale). "+
		"Each invocation logs the interval it was resident; coverage is the union of those intervals over the run's span.\n\n",
		d, int(d/(3*time.Second)), d*20)
	exec0(ctx, "TRUNCATE webhook_inbox, invoices, ledger_entries, outbox, anomalies")
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
