package bootstrap_test

import (
	"context"
	"io"
	"log/slog"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/bootstrap"
	"github.com/stripe-inbox/inbox/internal/config"
	"github.com/stripe-inbox/inbox/internal/pgtest"
)

// TestNewWorkerSetsTheCollector: building the worker sets the process's
// garbage collector to the configuration's target and memory limit. Not
// parallel: the collector's settings are the process's.
func TestNewWorkerSetsTheCollector(t *testing.T) {
	db := pgtest.DB(t)
	percent, limit := debug.SetGCPercent(100), debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetGCPercent(percent); debug.SetMemoryLimit(limit) })
	env := map[string]string{"DATABASE_URL": db.URL, "STRIPE_MODE": "test", "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "256"}
	cfg, err := config.LoadWorker(func(k string) string { return env[k] })
	require.NoError(t, err)
	_, pool, err := bootstrap.NewWorker(context.Background(), cfg, slog.New(slog.NewJSONHandler(io.Discard, nil)), io.Discard)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.Equal(t, config.WorkerGCPercent, debug.SetGCPercent(100))
	require.EqualValues(t, 192<<20, debug.SetMemoryLimit(limit))
}
