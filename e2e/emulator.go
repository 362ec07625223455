//go:build linux

package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Config describes one emulated function.
type Config struct {
	// Emulator is the path of aws-lambda-rie (InstallEmulator).
	Emulator string
	// Function names the function (AWS_LAMBDA_FUNCTION_NAME is inbox-<Function>).
	Function string
	// Bootstrap is the path of the function's bootstrap binary.
	Bootstrap string
	// Env is the function's own environment, as the CDK stack sets it. The
	// emulator forwards its whole environment to the function, so the
	// process gets only this plus the variables Lambda itself sets; nothing
	// leaks in from the test's environment.
	Env map[string]string
	// Timeout is the function's timeout, in whole seconds (the emulator
	// reads AWS_LAMBDA_FUNCTION_TIMEOUT and gives the handler's context that
	// deadline). Default 10s.
	Timeout time.Duration
	// MemoryMB is reported as the function's memory size. Default 256, as
	// the stack configures.
	MemoryMB int
}

// Emulator is one running aws-lambda-rie process serving one function. The
// function's process is started by the first invoke (its cold start), as in
// AWS.
type Emulator struct {
	Function string
	// InvokeURL is where invokes are POSTed.
	InvokeURL string
	// RuntimeAPI is the Runtime API address the bootstrap talks to.
	RuntimeAPI string

	cfg    Config
	cmd    *exec.Cmd
	out    *logBuffer
	exited chan struct{}
	client *http.Client

	stopOnce sync.Once
	stopErr  error
}

// startAttempts bounds the retries when a chosen port was taken between
// choosing it and the emulator binding it.
const startAttempts = 3

// Start runs the emulator for c on two free loopback ports and waits until
// both its invoke address and its Runtime API accept connections. ctx bounds
// the start only; call Stop to end the process.
func Start(ctx context.Context, c Config) (*Emulator, error) {
	if c.Timeout <= 0 {
		c.Timeout = 10 * time.Second
	}
	if c.Timeout%time.Second != 0 {
		return nil, fmt.Errorf("timeout %s: the emulator takes whole seconds", c.Timeout)
	}
	if c.MemoryMB <= 0 {
		c.MemoryMB = 256
	}
	var errs []error
	for range startAttempts {
		e, err := start(ctx, c)
		if err == nil {
			return e, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("starting the emulator for %s: %w", c.Function, errors.Join(errs...))
}

func start(ctx context.Context, c Config) (*Emulator, error) {
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	e := &Emulator{
		Function:   c.Function,
		RuntimeAPI: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])),
		cfg:        c,
		out:        &logBuffer{},
		exited:     make(chan struct{}),
		client:     &http.Client{Transport: &http.Transport{DisableKeepAlives: true}},
	}
	invokeAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1]))
	e.InvokeURL = "http://" + invokeAddr + "/2015-03-31/functions/function/invocations"

	// What Lambda sets for a function, then the function's own variables.
	env := map[string]string{
		"AWS_LAMBDA_FUNCTION_NAME":        "inbox-" + c.Function,
		"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": strconv.Itoa(c.MemoryMB),
		"AWS_LAMBDA_FUNCTION_VERSION":     "$LATEST",
		"AWS_LAMBDA_FUNCTION_TIMEOUT":     strconv.Itoa(int(c.Timeout / time.Second)),
		"LAMBDA_TASK_ROOT":                filepath.Dir(c.Bootstrap),
		"TZ":                              ":UTC",
		"PATH":                            "/usr/local/bin:/usr/bin:/bin",
	}
	maps.Copy(env, c.Env)
	cmd := exec.Command(c.Emulator,
		"--log-level", "info",
		"--runtime-api-address", e.RuntimeAPI,
		"--runtime-interface-emulator-address", invokeAddr,
		c.Bootstrap)
	cmd.Dir = filepath.Dir(c.Bootstrap)
	for _, k := range slices.Sorted(maps.Keys(env)) {
		cmd.Env = append(cmd.Env, k+"="+env[k])
	}
	// One writer for both streams keeps the emulator's lines and the
	// function's (which the emulator passes through) in order.
	cmd.Stdout, cmd.Stderr = e.out, e.out
	// Kill the emulator if the test process dies without stopping it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	// The function inherits the output pipe; never wait on it forever.
	cmd.WaitDelay = 3 * time.Second
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("running %s: %w", c.Emulator, err)
	}
	e.cmd = cmd
	go func() {
		_ = cmd.Wait()
		close(e.exited)
	}()

	readyCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	for _, addr := range []string{e.RuntimeAPI, invokeAddr} {
		if err := e.waitListening(readyCtx, addr); err != nil {
			_ = e.Stop()
			return nil, fmt.Errorf("%w\nemulator output:\n%s", err, e.Log())
		}
	}
	return e, nil
}

// waitListening waits until addr accepts a TCP connection, failing early
// when the emulator exits (it exits when it cannot bind its addresses).
func (e *Emulator) waitListening(ctx context.Context, addr string) error {
	var d net.Dialer
	for {
		select {
		case <-e.exited:
			return fmt.Errorf("the emulator exited before listening on %s", addr)
		default:
		}
		dialCtx, cancel := context.WithTimeout(ctx, time.Second)
		conn, err := d.DialContext(dialCtx, "tcp", addr)
		cancel()
		if err == nil {
			conn.Close()
			// The emulator may have lost the race for the port to another
			// process that now answers on it; make sure ours is alive.
			select {
			case <-e.exited:
				return fmt.Errorf("the emulator exited before listening on %s", addr)
			case <-time.After(20 * time.Millisecond):
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the emulator on %s: %w", addr, ctx.Err())
		case <-e.exited:
			return fmt.Errorf("the emulator exited before listening on %s", addr)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Response is the emulator's answer to an invoke.
type Response struct {
	// Status is the emulator's HTTP status: 200 for a handler's answer
	// (including a handler's error, which comes back as a JSON error
	// document), 502 when the function failed its init or crashed.
	Status int
	Body   []byte
}

// Invoke sends payload as the event of one invocation, as the Lambda service
// does, and returns the emulator's answer.
func (e *Emulator) Invoke(ctx context.Context, payload []byte) (Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.InvokeURL, bytes.NewReader(payload))
	if err != nil {
		return Response{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := e.client.Do(req)
	if err != nil {
		return Response{}, fmt.Errorf("invoking %s: %w", e.Function, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return Response{}, fmt.Errorf("reading %s's answer: %w", e.Function, err)
	}
	return Response{Status: resp.StatusCode, Body: body}, nil
}

// Log returns everything the emulator and the function wrote so far.
func (e *Emulator) Log() string { return e.out.String() }

// WaitLog waits until the log contains s (the function's output reaches the
// log through a pipe, possibly after the invoke has answered).
func (e *Emulator) WaitLog(ctx context.Context, s string) error {
	for {
		if strings.Contains(e.Log(), s) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the %s emulator's log never showed %q: %w", e.Function, s, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Inits returns the INIT phases the emulator has reported so far.
func (e *Emulator) Inits() []Init { return ParseInits(e.Log()) }

// Stop ends the emulator and the function it started: SIGTERM first (the
// emulator then shuts the function down the way Lambda does, so its SIGTERM
// hook runs), SIGKILL after 5s. It is safe to call more than once.
func (e *Emulator) Stop() error {
	e.stopOnce.Do(func() { e.stopErr = e.stop() })
	return e.stopErr
}

func (e *Emulator) stop() error {
	if e.cmd == nil || e.cmd.Process == nil {
		return nil
	}
	// The emulator puts the function in a process group of its own, so it
	// is found by parentage and killed by id if it outlives the emulator.
	children := childPIDs(e.cmd.Process.Pid)
	_ = e.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.exited:
	case <-time.After(5 * time.Second):
		_ = e.cmd.Process.Kill()
		select {
		case <-e.exited:
		case <-time.After(5 * time.Second):
			return fmt.Errorf("the %s emulator (pid %d) did not exit after SIGKILL", e.Function, e.cmd.Process.Pid)
		}
	}
	for _, pid := range children {
		if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err == nil && exe == e.cfg.Bootstrap {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	return nil
}

// childPIDs lists pid's child processes (Linux /proc).
func childPIDs(pid int) []int {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	var pids []int
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, field := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(field); err == nil {
				pids = append(pids, n)
			}
		}
	}
	return pids
}

// freePorts returns n distinct loopback ports that were free a moment ago.
func freePorts(n int) ([]int, error) {
	var ports []int
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("finding a free port: %w", err)
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// logBuffer collects the emulator's output; written by exec's copying
// goroutine, read by the test.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
