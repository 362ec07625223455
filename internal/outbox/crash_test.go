package outbox_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/database"
	"github.com/stripe-inbox/inbox/internal/outbox"
)

const (
	crashChildEnv   = "INBOX_OUTBOX_CRASH_CHILD_DB"
	crashChildAppID = "outbox-crash-child" // AWS_SDK_UA_APP_ID: the stand-in tells the child's calls apart
)

func TestMain(m *testing.M) {
	if url := os.Getenv(crashChildEnv); url != "" {
		crashChild(url)
		return
	}
	os.Exit(m.Run())
}

// crashChild is a real relay process: the SDK configured from the
// environment as in production (AWS_ENDPOINT_URL_EVENTBRIDGE, AWS_REGION,
// static credentials), relaying until it is killed.
func crashChild(url string) {
	ctx := context.Background()
	pool, err := database.Open(ctx, database.Config{URL: url, MaxConns: 2}, nil)
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(2)
	}
	cfg, err := awsconfig.LoadDefaultConfig(ctx)
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(2)
	}
	r, err := outbox.New(pool, eventbridge.NewFromConfig(cfg), crashConfig(), nil, nil)
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(2)
	}
	for {
		s, err := r.Run(ctx)

		if err != nil {
			fmt.Println("ERROR", err)
		}
		if s.Calls == 0 {
			time.Sleep(5 * time.Millisecond) // idle: poll again
		}
	}
}

// crashConfig: a short lease, so rows a killed relay held come back soon;
// attempts enough that kills never park a row.
func crashConfig() outbox.Config {
	return outbox.Config{Bus: bus, ClaimLimit: 10, Lease: time.Second, CallTimeout: 500 * time.Millisecond, MaxAttempts: 1000,
		BackoffBase: 10 * time.Millisecond, BackoffCap: 50 * time.Millisecond}
}

// A relay process killed between PutEvents and the mark, again and again,
// while rows keep arriving and another relay competes for them: every row
// is published at least once and ends marked, none is lost, and the
// duplicates (rows published again after a kill) are counted.
func TestRelayKilledBetweenPutEventsAndTheMarkLosesNothing(t *testing.T) {
	t.Parallel()
	const kills = 25
	b := setup(t)

	// The child in flight, and the kill of the child's every 3rd call: in
	// the stand-in's hold, after the entries were accepted, before the
	// answer, so the child never marks them.
	var (
		mu         sync.Mutex
		child      *exec.Cmd
		exited     chan struct{}
		childCalls int
		killed     atomic.Int32
	)
	b.eb.Hold(func(_ int, r *http.Request) {
		if !strings.Contains(r.Header.Get("User-Agent"), crashChildAppID) {
			return
		}
		mu.Lock()
		childCalls++
		kill := childCalls%3 == 0 && child != nil
		cmd, gone := child, exited
		if kill {
			child = nil
		}
		mu.Unlock()
		if kill {
			_ = cmd.Process.Kill() // SIGKILL
			<-gone
		}
	})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup

	// Load: rows keep arriving until the kills are done. The supply follows
	// the relays, not a fixed count: whenever fewer than backlog rows wait,
	// five more arrive. So there is always work for a child to take, however
	// fast the server publishes and however slowly a child starts (a fixed
	// cap of rows ran out before the 25th kill on a fast server, and the
	// child then waited forever for a row), and the table stays small.
	const backlog = 40
	var inserted []int64
	var insertWG sync.WaitGroup
	insertWG.Add(1)
	go func() {
		defer insertWG.Done()
		for killed.Load() < kills {
			if b.db.Count(t, "outbox", "published_at IS NULL") < backlog {
				inserted = append(inserted, b.insert(t, 5, 200)...)
				continue
			}
			time.Sleep(2 * time.Millisecond) // a poll of the backlog's state, not a wait for time to pass
		}
	}()

	// A competing relay in this process.
	competitor := b.relay(t, crashConfig())
	var competitorErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			s, err := competitor.Run(ctx)
			if err != nil && ctx.Err() == nil {
				competitorErr = err
				return
			}
			if s.Calls == 0 {
				time.Sleep(5 * time.Millisecond)
			}
		}
	}()

	// The child relays, restarted after each kill.
	starts := 0
	for killed.Load() < kills {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), append(b.eb.Env(), crashChildEnv+"="+b.db.URL, "AWS_SDK_UA_APP_ID="+crashChildAppID)...)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		gone := make(chan struct{})
		mu.Lock()
		child, exited = cmd, gone
		mu.Unlock()
		require.NoError(t, cmd.Start())
		starts++
		err := cmd.Wait()
		killed.Add(1)
		close(gone)
		require.Error(t, err)
		require.Contains(t, err.Error(), "killed", "the child only ends by the kill")
	}
	insertWG.Wait() // the competitor runs on
	total := len(inserted)

	// Every row ends published and marked (rows a killed child held come
	// back after its lease, 1 s).
	b.db.WaitUntil(t, "every outbox row is marked published", "SELECT count(*) = 0 FROM outbox WHERE published_at IS NULL")
	cancel()
	wg.Wait()
	require.NoError(t, competitorErr)

	published := b.eb.Published()
	duplicates := 0
	for _, id := range inserted {
		n := published[id]
		require.GreaterOrEqual(t, n, 1, "outbox row %d was never published", id)
		duplicates += n - 1
	}
	require.Len(t, published, total, "nothing but the rows was published")
	require.Equal(t, total, b.db.Count(t, "outbox", "published_at IS NOT NULL"))
	require.GreaterOrEqual(t, duplicates, kills, "each kill left at least one accepted entry unmarked, published again")
	msg := fmt.Sprintf("outbox crash test: %d rows, %d child relays started, %d killed between PutEvents and the mark, %d entries accepted, %d duplicates (%.2f%%), 0 lost",
		total, starts, killed.Load(), len(b.eb.Events()), duplicates, 100*float64(duplicates)/float64(total))
	t.Log(msg)
	fmt.Println(msg)
}
