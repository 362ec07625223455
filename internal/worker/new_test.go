package worker_test

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/worker"
)

// TestNewValidates: as River's NewClient, New fills the defaults and refuses
// a configuration that would break a guarantee, saying what to fix; it
// never returns a worker for it.
func TestNewValidates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))

	w, err := worker.New(b.pool, handlers.Default(), worker.Config{Mode: worker.ModeTest}, logger, nil)
	require.NoError(t, err, "the zero values take the defaults")
	require.NotNil(t, w)

	for name, tc := range map[string]struct {
		cfg  worker.Config
		want []string
	}{
		"no mode":        {worker.Config{}, []string{"invalid worker configuration", `STRIPE_MODE=""`}},
		"batch too big":  {worker.Config{Mode: worker.ModeTest, ClaimLimit: 100, BatchSize: 65}, []string{"BATCH_SIZE=65: must be at most 64"}},
		"lease too long": {worker.Config{Mode: worker.ModeLive, Lease: 2 * time.Hour}, []string{"LEASE=2h0m0s: must be from 1s to 1h"}},
		"two mistakes":   {worker.Config{Mode: "x", Concurrency: 100}, []string{`STRIPE_MODE="x"`, "WORKER_CONCURRENCY=100"}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			w, err := worker.New(b.pool, handlers.Default(), tc.cfg, logger, nil)
			require.Nil(t, w)
			for _, want := range tc.want {
				require.ErrorContains(t, err, want)
			}
		})
	}
	_, err = worker.New(nil, nil, worker.Config{Mode: worker.ModeTest}, nil, nil)
	require.ErrorContains(t, err, "no database pool")
	require.ErrorContains(t, err, "no handler registry")
	require.ErrorContains(t, err, "no logger")
}
