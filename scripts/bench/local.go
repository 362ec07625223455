package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"regexp"
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
