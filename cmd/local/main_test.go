package main

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/wake"
)

// skipWatch counts the scheduler's "run skipped" records.
type skipWatch struct{ skipped atomic.Int64 }

func (h *skipWatch) Enabled(context.Context, slog.Level) bool { return true }
func (h *skipWatch) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *skipWatch) WithGroup(string) slog.Handler            { return h }
func (h *skipWatch) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "run skipped: the previous runs are still going" {
		h.skipped.Add(1)
	}
	return nil
}

// TestOverlappingRunsAreLimited: runs that do not end (a resident run stuck
// past its timeout) do not pile up: at most maxResidentRuns go on at once,
// and the ticks that find them running are skipped and logged. Before,
// every tick started another run, each holding connections of its own.
func TestOverlappingRunsAreLimited(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		wg            sync.WaitGroup
		running, most atomic.Int64
	)
	release := make(chan struct{})
	watch := &skipWatch{}
	schedule(ctx, &wg, slog.New(watch), "worker", time.Millisecond, time.Hour, maxResidentRuns, nil, func(context.Context) {
		n := running.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		<-release // the run goes on until the test ends it
		running.Add(-1)
	})
	deadline := time.Now().Add(30 * time.Second)
	for watch.skipped.Load() < 3 {
		require.True(t, time.Now().Before(deadline), "gave up waiting for ticks to be skipped; %d runs going", running.Load())
		time.Sleep(time.Millisecond)
	}
	require.EqualValues(t, maxResidentRuns, most.Load())
	close(release)
	cancel()
	wg.Wait()
}

// TestAWakeStartsARunBeforeTheTick: with WORKER_WAKE the webhook's signal
// starts the next run at once, not at the next WORKER_INTERVAL tick.
func TestAWakeStartsARunBeforeTheTick(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	wakes := wake.NewSignal()
	runs := make(chan struct{}, 10)
	schedule(ctx, &wg, slog.New(slog.DiscardHandler), "worker", time.Hour, time.Hour, 1, wakes, func(context.Context) {
		runs <- struct{}{}
	})
	<-runs // the first run starts at once, as the schedule's does
	require.NoError(t, wakes.Wake(ctx))
	<-runs // the tick is an hour away: only the wake can start this one
	cancel()
	wg.Wait()
}
