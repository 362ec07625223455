package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// localRunner is a running cmd/local.
type localRunner struct {
	cmd    *exec.Cmd
	stdout *bytes.Buffer // its printed lines
	stderr *lockedBuffer // its JSON log
	url    string        // the webhook's URL, when it runs one
	ebURL  string        // its POST /_eventbridge, when it runs the webhook
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

// linesFrom returns the complete lines written from offset off on, and the
// offset after them: a poll of the log reads each line once, so it costs
// the machine (shared with the process measured) only the new lines.
func (l *lockedBuffer) linesFrom(off int) ([]string, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.b.Bytes()[off:]
	end := bytes.LastIndexByte(b, '\n')
	if end < 0 {
		return nil, off
	}
	return strings.Split(string(b[:end]), "\n"), off + end + 1
}

var listeningLine = regexp.MustCompile(`listening on (http://\S+) `)

// startLocal starts cmd/local with env (on top of a clean environment: PATH
// and HOME only) and waits for its worker to start (unless env says
// LOCAL_COMPONENTS=webhook) and, with webhook, for its webhook to listen.
func startLocal(webhook bool, env ...string) *localRunner {
	worker := !slices.Contains(env, "LOCAL_COMPONENTS=webhook")
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
			r.noteListening(l)
			if (!worker || strings.HasPrefix(l, "worker running")) && (!webhook || (r.url != "" && r.ebURL != "")) {
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

// noteListening reads the runner's "listening on" lines: the webhook
// prints one per endpoint, then the /_eventbridge line (issue 26). r.url is
// the first endpoint's (before, the last line won, and the latency section
// posted signed events to /_eventbridge), r.ebURL the /_eventbridge one.
func (r *localRunner) noteListening(line string) {
	m := listeningLine.FindStringSubmatch(line)
	switch {
	case m == nil:
	case strings.HasSuffix(m[1], "/_eventbridge"):
		r.ebURL = m[1]
	case r.url == "":
		r.url = m[1]
	}
}

// cpu is the CPU time the runner's process has used so far, user and
// system (utime + stime of /proc/PID/stat, in clock ticks of 10 ms: Linux's
// USER_HZ is 100 on every architecture Go runs on).
func (r *localRunner) cpu() time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", r.cmd.Process.Pid))
	check(err)
	_, t, _ := procCPU(b)
	return t
}

// procCPU reads a /proc/PID/stat: the command's name, the CPU time (user
// and system) the process has used, and the CPU time its children that
// have ended and that it waited for used.
func procCPU(b []byte) (name string, self, children time.Duration) {
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return "", 0, 0
	}
	// The fields after the command name (which may hold spaces), from the
	// state on: utime, stime, cutime and cstime are the 12th to 15th of
	// them (proc(5)), in clock ticks (100 a second).
	f := strings.Fields(string(b[end+1:]))
	var t [4]int64
	for i := range t {
		v, err := strconv.ParseInt(f[11+i], 10, 64)
		check(err)
		t[i] = v
	}
	tick := 10 * time.Millisecond
	return string(b[open+1 : end]), time.Duration(t[0]+t[1]) * tick, time.Duration(t[2]+t[3]) * tick
}

// postgresCPU is the CPU time used so far by every process named postgres on
// this machine, with the children they waited for: a backend or an
// autovacuum worker that ended is counted in its parent's, the
// postmaster's, once the postmaster has reaped it. Read before and after a
// drain, it counts the processes that started in between, and the ones
// that ended in between still count.
func postgresCPU() time.Duration {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var total time.Duration
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // it ended
		}
		if name, self, children := procCPU(b); name == "postgres" {
			total += self + children
		}
	}
	return total
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
