package writeback_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/database"
	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/stripeapitest"
	"github.com/stripe-inbox/inbox/internal/writeback"
)

const crashChildEnv = "INBOX_WRITEBACK_CRASH_CHILD_DB"

func TestMain(m *testing.M) {
	if url := os.Getenv(crashChildEnv); url != "" {
		crashChild(url)
		return
	}
	os.Exit(m.Run())
}

// crashChild is a real sender process: the client configured from the
// environment as the local runner does (STRIPE_API_KEY, STRIPE_API_BASE),
// sending one intent per claim until it is killed.
func crashChild(url string) {
	ctx := context.Background()
	pool, err := database.Open(ctx, database.Config{URL: url, MaxConns: 2}, nil)
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(2)
	}
	api, err := writeback.NewClient(writeback.ClientConfig{Key: os.Getenv("STRIPE_API_KEY"), BaseURL: os.Getenv("STRIPE_API_BASE")})
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(2)
	}
	cfg := testConfig()
	cfg.ClaimLimit = 1
	s, err := writeback.New(writeback.DBStore{DB: pool}, api, cfg, nil, nil)
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(2)
	}
	for {
		sum, err := s.Run(ctx)
		if err != nil {
			fmt.Println("ERROR", err)
		}
		if sum.Claimed == 0 {
			time.Sleep(5 * time.Millisecond) // idle: poll again
		}
	}
}

// A sender process killed between the call and the record, three times
// (one intent each): Stripe applied each call, the sender never learnt it.
// A sender after the lease sends each again with the same key; the stand-in
// replays the first result, so each is applied once, and recorded.
func TestSenderKilledBetweenTheCallAndTheRecordAppliesOnce(t *testing.T) {
	t.Parallel()
	const rounds = 3
	b := setup(t, "cus_1", "cus_2", "cus_3")
	for i := 1; i <= rounds; i++ {
		b.pay(t, fmt.Sprintf("in_%d", i), fmt.Sprintf("cus_%d", i))
	}

	// The child in flight; its POST is executed by the stand-in, then the
	// child is killed before the answer is written, so it cannot record.
	var (
		mu     sync.Mutex
		child  *exec.Cmd
		exited chan struct{}
		kills  int
	)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := httptest.NewRecorder()
		b.stripe.ServeHTTP(rec, r)
		if r.Method == http.MethodPost {
			mu.Lock()
			cmd, gone := child, exited
			child = nil
			if cmd != nil {
				kills++ // counted before the kill: the test reads it once the child is gone
			}
			mu.Unlock()
			if cmd != nil {
				_ = cmd.Process.Kill() // SIGKILL, after the execution, before the answer
				<-gone
			}
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	}))
	defer front.Close()

	exe, err := os.Executable()
	require.NoError(t, err)
	for round := 1; round <= rounds; round++ {
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), crashChildEnv+"="+b.db.URL, "STRIPE_API_KEY="+stripeapitest.Key, "STRIPE_API_BASE="+front.URL)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		gone := make(chan struct{})
		mu.Lock() // held through Start: the handler sees the child only once it has started
		child, exited = cmd, gone
		err := cmd.Start()
		mu.Unlock()
		require.NoError(t, err)
		go func() { _ = cmd.Wait(); close(gone) }()
		select {
		case <-gone:
		case <-time.After(2 * time.Minute):
			_ = cmd.Process.Kill()
			t.Fatalf("round %d: the child was never killed: %s", round, b.stripe)
		}
		mu.Lock()
		killed := kills
		mu.Unlock()
		require.Equal(t, round, killed, "the child died on its own")
	}
	require.Equal(t, rounds, b.stripe.AppliedTotal(), "each killed call ran")
	require.Equal(t, rounds, b.db.Count(t, "writeback_intents", "status = 'pending' AND claim_token IS NOT NULL"), "none recorded")

	// After the leases: another sender sends each again, with its key.
	api, err := writeback.NewClient(writeback.ClientConfig{Key: stripeapitest.Key, BaseURL: front.URL})
	require.NoError(t, err)
	later := time.Now().Add(time.Hour)
	s, err := writeback.New(writeback.DBStore{DB: b.db.Pool, Now: func() *time.Time { return &later }}, api, testConfig(), nil, nil)
	require.NoError(t, err)
	sum, err := s.Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, rounds, sum.Done)
	require.Equal(t, rounds, b.db.Count(t, "writeback_intents", "status = 'done' AND result_via = 'call' AND attempts = 2"))
	for i := 1; i <= rounds; i++ {
		key := handlers.CustomerMetadataKey(fmt.Sprintf("in_%d", i))
		require.Equal(t, 1, b.stripe.Applied(key), "applied once: %s", key)
		var sent, replayed int
		for _, p := range posts(b.stripe.Requests()) {
			if p.IdempotencyKey == key {
				sent++
				if p.Replayed {
					replayed++
				}
			}
		}
		require.Equal(t, 2, sent, key)
		require.Equal(t, 1, replayed, key)
	}
}
