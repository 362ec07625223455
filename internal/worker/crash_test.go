package worker_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/database"
	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/worker"
)

const (
	crashChildEnv       = "INBOX_WORKER_CRASH_CHILD_DB"
	crashChildBatchEnv  = "INBOX_WORKER_CRASH_CHILD_BATCH"   // batch size (default 1)
	crashChildHangOnEnv = "INBOX_WORKER_CRASH_CHILD_HANG_ON" // event id to hang on (default: the first)
)

func TestMain(m *testing.M) {
	if url := os.Getenv(crashChildEnv); url != "" {
		crashChild(url)
		return
	}
	os.Exit(m.Run())
}

// crashChild runs a real worker whose invoice.paid handler, after applying
// its effect inside the processing transaction, says so on stdout and then
// hangs until the parent kills the process.
func crashChild(url string) {
	ctx := context.Background()
	pool, err := database.Open(ctx, database.Config{URL: url, MaxConns: 2}, nil)
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(2)
	}
	reg := handlers.Default()
	real := reg["invoice.paid"]
	hangOn := os.Getenv(crashChildHangOnEnv)
	reg["invoice.paid"] = handlers.HandlerFunc(func(ctx context.Context, tx handlers.DB, ev handlers.Event) (handlers.Result, error) {
		res, err := real(ev)(ctx, tx)
		if hangOn != "" && ev.ID != hangOn {
			return res, err
		}
		fmt.Println("APPLIED", ev.ID, err)
		select {} // the middle of processing: effect applied, nothing committed
	})
	batch, _ := strconv.Atoi(os.Getenv(crashChildBatchEnv))
	// The lease is a minute (the parent processes 2 minutes later), so a
	// claim of up to 6 receipts at 10s each fits in it, as New checks.
	cfg := worker.Config{Mode: worker.ModeTest, Concurrency: 1, Lease: time.Minute, StatementTimeout: 10 * time.Second, DeadlineMargin: 40 * time.Second,
		ClaimLimit: max(batch, 1), BatchSize: max(batch, 1)}
	w, err := worker.New(pool, reg, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		fmt.Println("UNEXPECTED:", err)
		os.Exit(3)
	}
	_, _ = w.Run(ctx)
	fmt.Println("UNEXPECTED: run returned")
	os.Exit(3)
}

func TestProcessKilledMidProcessingIsReclaimedAfterLeaseAndProcessedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.receive(t, paid("evt_kill", "in_k"))

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+b.db.URL)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "APPLIED evt_kill <nil>", strings.TrimSpace(line))

	// The claim committed; the effect did not.
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "attempts = 1 AND processed_at IS NULL"))
	require.Equal(t, 0, b.db.Count(t, "ledger_entries", ""))

	require.NoError(t, cmd.Process.Kill()) // SIGKILL
	err = cmd.Wait()
	require.Error(t, err, "the child was killed")
	require.Contains(t, err.Error(), "killed")
	waitForNoOpenTransaction(t, b)

	// Within the lease no worker takes it.
	w := b.newWorker(t, nil, worker.Config{Concurrency: 2})
	require.Equal(t, 0, b.run(t, w).Processed)
	require.Equal(t, 0, b.db.Count(t, "ledger_entries", ""))

	// After the lease, it is processed exactly once.
	w.Now = at(time.Now().UTC().Add(2 * time.Minute))
	s := b.run(t, w)
	require.Equal(t, 1, s.Processed)
	require.Equal(t, 1, b.db.Count(t, "ledger_entries", "invoice_id = 'in_k'"))
	require.Equal(t, 1, b.db.Count(t, "outbox", ""))
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "attempts = 2 AND processed_at IS NOT NULL"))
}

// waitForNoOpenTransaction waits until the killed child's backend has
// noticed the closed socket and rolled back.
func waitForNoOpenTransaction(t *testing.T, b *testBundle) {
	t.Helper()
	b.db.WaitUntil(t, "the killed worker's transaction is gone",
		`SELECT count(*) = 0 FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%'`)
}
