package config

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestLoadReconcile(t *testing.T) {
	t.Parallel()
	c, err := LoadReconcile(MapEnv(map[string]string{"STRIPE_API_KEY": "rk_test_abc", "DATABASE_URL": "postgres://x@127.0.0.1/db", "WEBHOOK_ENDPOINT": "shop"}))
	require.NoError(t, err)
	require.Equal(t, "shop", c.Reconcile.Endpoint)
	require.Equal(t, 72*time.Hour, c.Reconcile.Lookback)
	require.Equal(t, time.Minute, c.Reconcile.Settle)
	require.Equal(t, DefaultStripeAPIBase, c.Client.BaseURL)
	require.Len(t, c.Reconcile.Types, len(HandlerTypes()))

	c, err = LoadReconcile(MapEnv(map[string]string{
		"STRIPE_API_KEY_SECRET_ARN": "arn:aws:secretsmanager:us-east-1:1:secret:k", "STORE_FUNCTION": "store",
		"RECONCILE_LOOKBACK": "30d", "STRIPE_API_BASE": "http://127.0.0.1:12111/", "STRIPE_MODE": "live",
	}))
	require.NoError(t, err)
	require.Equal(t, 30*24*time.Hour, c.Reconcile.Lookback)
	require.Equal(t, "http://127.0.0.1:12111", c.Client.BaseURL)
	require.True(t, c.APIKeyFromSecretsManager)

	_, err = LoadReconcile(MapEnv(map[string]string{
		"STRIPE_API_KEY": "whsec_oops", "RECONCILE_LOOKBACK": "31d", "RECONCILE_SETTLE": "6m",
		"STRIPE_API_BASE": "api.stripe.com", "RECONCILE_RATE": "500",
	}))
	require.ErrorContains(t, err, "STRIPE_API_KEY: it is not a Stripe API key")
	require.ErrorContains(t, err, `RECONCILE_LOOKBACK="31d"`)
	require.ErrorContains(t, err, `RECONCILE_SETTLE="6m"`)
	require.ErrorContains(t, err, `STRIPE_API_BASE="api.stripe.com"`)
	require.ErrorContains(t, err, `RECONCILE_RATE="500"`)
	require.ErrorContains(t, err, "nowhere to store")

	_, err = LoadReconcile(MapEnv(map[string]string{"STRIPE_API_KEY": "rk_live_abc", "STRIPE_MODE": "test", "DATABASE_URL": "postgres://x@127.0.0.1/db"}))
	require.ErrorContains(t, err, "live-mode key but STRIPE_MODE=test")
}

func TestLoadReconcileStore(t *testing.T) {
	t.Parallel()
	c, err := LoadReconcileStore(MapEnv(map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1/db", "RECONCILE_ENDPOINTS": "billing,connect"}))
	require.NoError(t, err)
	require.Equal(t, []string{"billing", "connect"}, c.Endpoints)
	_, err = LoadReconcileStore(MapEnv(map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1/db", "RECONCILE_ENDPOINTS": "Bad Name"}))
	require.ErrorContains(t, err, "is not an endpoint name")
}

// The local contract: the reconciler runs when STRIPE_API_KEY is set, every
// RECONCILE_INTERVAL (15m), for WEBHOOK_ENDPOINT, through DATABASE_URL.
func TestLocalReconcileContract(t *testing.T) {
	t.Parallel()
	base := map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1/db", "STRIPE_WEBHOOK_SECRET": "whsec_x", "WEBHOOK_ENDPOINT": "shop"}
	env := func(extra map[string]string) Env {
		return func(k string) string {
			if v, ok := extra[k]; ok {
				return v
			}
			return base[k]
		}
	}
	l, err := LoadLocal(env(nil))
	require.NoError(t, err)
	require.False(t, l.Runs(LocalReconcile), "no key, no reconciler")

	l, err = LoadLocal(env(map[string]string{"STRIPE_API_KEY": "rk_test_x", "STRIPE_API_BASE": "http://127.0.0.1:12111"}))
	require.NoError(t, err)
	require.True(t, l.Runs(LocalReconcile))
	require.Equal(t, 15*time.Minute, l.ReconcileInterval)
	require.Equal(t, "shop", l.Reconcile.Reconcile.Endpoint)
	require.Equal(t, 72*time.Hour, l.Reconcile.Reconcile.Lookback)
	require.Equal(t, "http://127.0.0.1:12111", l.Reconcile.Client.BaseURL)
	require.Equal(t, "postgres://x@127.0.0.1/db", l.Reconcile.Database.URL)

	l, err = LoadLocal(env(map[string]string{"STRIPE_API_KEY": "rk_test_x", "LOCAL_COMPONENTS": "webhook,worker"}))
	require.NoError(t, err)
	require.False(t, l.Runs(LocalReconcile), "LOCAL_COMPONENTS without reconcile")

	_, err = LoadLocal(env(map[string]string{"LOCAL_COMPONENTS": "worker,reconcile"}))
	require.ErrorContains(t, err, "LOCAL_COMPONENTS lists reconcile but STRIPE_API_KEY is not set")
	_, err = LoadLocal(env(map[string]string{"STRIPE_API_KEY": "rk_test_x", "RECONCILE_LOOKBACK": "45d", "RECONCILE_SETTLE": "10m", "RECONCILE_INTERVAL": "forever"}))
	require.ErrorContains(t, err, `RECONCILE_LOOKBACK="45d"`)
	require.ErrorContains(t, err, `RECONCILE_SETTLE="10m"`)
	require.ErrorContains(t, err, `RECONCILE_INTERVAL="forever"`)
}
