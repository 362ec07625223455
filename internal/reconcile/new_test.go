package reconcile_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/reconcile"
)

// unusedLister stands in for the Events API client where New is only
// built, never run.
type unusedLister struct{}

func (unusedLister) ListPage(context.Context, reconcile.Query) (reconcile.Page, error) {
	panic("not called: the reconciler is only built")
}

// TestNewValidates: as worker.New, New refuses an invalid configuration or
// a missing dependency, saying what to fix, and never returns a reconciler
// for it. It takes no defaults: a zero overlap or settle is kept.
func TestNewValidates(t *testing.T) {
	t.Parallel()
	cfg := reconcile.Config{Endpoint: "billing", Types: []string{"invoice.paid"}}.WithDefaults()
	cfg.Overlap, cfg.Settle = 0, 0
	r, err := reconcile.New(reconcile.DBSink{}, unusedLister{}, cfg, nil, nil)
	require.NoError(t, err)
	require.NotNil(t, r)

	bad := cfg
	bad.Endpoint, bad.Lookback = "", 31*24*time.Hour
	r, err = reconcile.New(reconcile.DBSink{}, unusedLister{}, bad, nil, nil)
	require.Nil(t, r)
	require.ErrorContains(t, err, "invalid reconcile configuration")
	require.ErrorContains(t, err, "RECONCILE_ENDPOINT")
	require.ErrorContains(t, err, "RECONCILE_LOOKBACK=744h0m0s")

	_, err = reconcile.New(nil, nil, reconcile.Config{}, nil, nil)
	require.ErrorContains(t, err, "no sink")
	require.ErrorContains(t, err, "no Events API client")
	require.ErrorContains(t, err, "no event types to list")
}
