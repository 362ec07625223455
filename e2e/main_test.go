//go:build linux

package e2e_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stripe-inbox/inbox/e2e"
)

// harness is what every scenario shares: the binaries (built once per test
// binary) and the emulator (installed once).
type harness struct {
	root     string
	emulator string
	bins     e2e.Binaries
}

var (
	setupOnce sync.Once
	shared    harness
	setupErr  error
	workDir   string
	recorder  = e2e.NewRecorder()
)

func TestMain(m *testing.M) {
	code := m.Run()
	if err := writeReport(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		if code == 0 {
			code = 1
		}
	}
	if workDir != "" {
		os.RemoveAll(workDir)
	}
	os.Exit(code)
}

// writeReport prints the per-function summary (with -v) and writes it to
// E2E_REPORT when that is set.
func writeReport() error {
	reports := recorder.Reports()
	if len(reports) == 0 {
		return nil
	}
	if testing.Verbose() {
		fmt.Println("e2e report (binary sizes, cold-start INIT durations under aws-lambda-rie):")
		for _, r := range reports {
			fmt.Println("  " + r.String())
		}
	}
	path := os.Getenv("E2E_REPORT")
	if path == "" {
		return nil
	}
	var buf bytes.Buffer
	if err := e2e.WriteReports(&buf, reports); err != nil {
		return err
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("writing E2E_REPORT: %w", err)
	}
	return nil
}

// setup builds the functions and installs the emulator, once for all tests
// (concurrently: the build and the install do not depend on each other).
func setup(t *testing.T) harness {
	t.Helper()
	setupOnce.Do(func() {
		// A cold module and build cache on a fresh machine takes minutes;
		// a warm one seconds.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		start := time.Now()
		root, err := e2e.RepoRoot(".")
		if err != nil {
			setupErr = err
			return
		}
		shared.root = root
		if workDir, err = os.MkdirTemp("", "inbox-e2e-"); err != nil {
			setupErr = err
			return
		}
		var wg sync.WaitGroup
		var buildErr, installErr error
		wg.Go(func() { shared.bins, buildErr = e2e.Build(ctx, root, workDir) })
		wg.Go(func() { shared.emulator, installErr = e2e.InstallEmulator(ctx, root) })
		wg.Wait()
		switch {
		case buildErr != nil:
			setupErr = fmt.Errorf("building the functions: %w", buildErr)
		case installErr != nil:
			setupErr = fmt.Errorf("installing the emulator: %w", installErr)
		}
		for _, b := range shared.bins.Built {
			recorder.Binary(b)
		}
		if setupErr == nil {
			fmt.Fprintf(os.Stderr, "e2e: built %d functions and found the emulator in %s\n", len(shared.bins.Built), time.Since(start).Round(time.Millisecond))
		}
	})
	if setupErr != nil {
		t.Fatal(setupErr)
	}
	return shared
}

// binary returns function's bootstrap, skipping (loudly) when functions/
// holds no main package for it.
func (h harness) binary(t *testing.T, function string) e2e.Binary {
	t.Helper()
	b, ok := h.bins.Built[function]
	if !ok {
		t.Skipf("functions/%s holds no main package: its binary was not built and this scenario did not run", function)
	}
	return b
}

// emulate starts function under its own emulator with env and stops it when
// t ends, recording its INIT phases and logging them (and, when t failed,
// the whole emulator log).
func emulate(t *testing.T, function string, env map[string]string, timeout time.Duration) *e2e.Emulator {
	t.Helper()
	h := setup(t)
	bin := h.binary(t, function)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	em, err := e2e.Start(ctx, e2e.Config{
		Emulator:  h.emulator,
		Function:  function,
		Bootstrap: bin.Path,
		Env:       env,
		Timeout:   timeout,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stopStart := time.Now()
		if err := em.Stop(); err != nil {
			t.Error(err)
		}
		t.Logf("%s emulator stopped in %s", function, time.Since(stopStart).Round(time.Millisecond))
		inits := em.Inits()
		recorder.Inits(function, inits)
		for _, in := range inits {
			t.Logf("%s: INIT phase=%s status=%s duration=%s (binary %d bytes)", function, in.Phase, in.Status, in.Duration, bin.Size)
		}
		if t.Failed() {
			t.Logf("%s emulator log:\n%s", function, em.Log())
		}
	})
	return em
}

// invoke sends payload to em and returns the answer, failing t on a
// transport error. Every invoke is bounded.
func invoke(t *testing.T, em *e2e.Emulator, payload []byte) e2e.Response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := em.Invoke(ctx, payload)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// waitLog fails t unless em's log shows s within 10s.
func waitLog(t *testing.T, em *e2e.Emulator, s string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := em.WaitLog(ctx, s); err != nil {
		t.Error(err)
	}
}

// coldStarts counts the INIT phases em ran: 1 means the function was started
// once and every later invoke reused it.
func coldStarts(em *e2e.Emulator) int {
	return strings.Count(em.Log(), "INIT START(")
}

// TestBinaries reports what was built, and which function folders had no
// main package to build.
func TestBinaries(t *testing.T) {
	t.Parallel()
	h := setup(t)
	for _, name := range []string{"webhook", "worker"} {
		if _, ok := h.bins.Built[name]; !ok {
			t.Errorf("functions/%s was not built", name)
		}
	}
	for name, b := range h.bins.Built {
		t.Logf("built %-8s %9d bytes  %s", name, b.Size, b.Path)
		if b.Size == 0 {
			t.Errorf("%s: empty binary", name)
		}
	}
	for _, name := range h.bins.Missing {
		t.Logf("NOT BUILT: functions/%s holds no main package; its scenarios are skipped", name)
	}
}
