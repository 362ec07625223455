package bootstrap_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/bootstrap"
	"github.com/stripe-inbox/inbox/internal/config"
	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/stripeapitest"
)

// TestWritebackFunctionSendsAndEmitsTheBacklog: the writeback function's
// wiring (here storing through DATABASE_URL, the stand-in for Stripe): one
// invocation sends the due intent once, records it, and emits the
// backlog's three gauges.
func TestWritebackFunctionSendsAndEmitsTheBacklog(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	api := stripeapitest.New("cus_1")
	t.Cleanup(api.Close)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `
INSERT INTO writeback_intents (kind, target, params, idempotency_key, event_id)
VALUES ('customer_metadata', 'cus_1', '{"metadata": {"last_paid_invoice": "in_1"}}', 'inbox:customer_metadata:in_1:payment', 'evt_1')`)
	require.NoError(t, err)
	env := map[string]string{"STRIPE_API_KEY": stripeapitest.Key, "STRIPE_API_BASE": api.URL, "DATABASE_URL": db.URL, "METRICS_NAMESPACE": "Test"}
	cfg, err := config.LoadWriteback(func(k string) string { return env[k] })
	require.NoError(t, err)
	var emf bytes.Buffer
	w, err := bootstrap.NewWriteback(ctx, cfg, slog.New(slog.NewJSONHandler(io.Discard, nil)), &emf)
	require.NoError(t, err)
	t.Cleanup(w.Close)
	sum, err := w.Invoke(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, sum.Calls)
	require.Equal(t, 1, sum.Done)
	require.Equal(t, 1, api.Applied("inbox:customer_metadata:in_1:payment"))
	require.Equal(t, 1, db.Count(t, "writeback_intents", "status = 'done'"))
	for _, g := range []string{`"WritebacksPending":0`, `"WritebacksOldestAgeSeconds":0`, `"WritebacksParked":0`} {
		require.Contains(t, emf.String(), g)
	}
	sum, err = w.Invoke(ctx)
	require.NoError(t, err)
	require.Zero(t, sum.Calls)
}
