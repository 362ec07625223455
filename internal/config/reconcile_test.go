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
	require.Equal(t, time.Hour, c.Reconcile.Settle, "long enough that Stripe's own retries normally win")
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
		"STRIPE_API_KEY": "whsec_oops", "RECONCILE_LOOKBACK": "31d", "RECONCILE_SETTLE": "73h",
		"STRIPE_API_BASE": "api.stripe.com", "RECONCILE_RATE": "500",
	}))
	require.ErrorContains(t, err, "STRIPE_API_KEY: it is not a Stripe API key")
	require.ErrorContains(t, err, "RECONCILE_LOOKBACK=744h0m0s: must be from 1m to 30d")
	require.ErrorContains(t, err, "RECONCILE_SETTLE=73h0m0s: must be from 0 to 72h0m0s")
	require.ErrorContains(t, err, `STRIPE_API_BASE="api.stripe.com"`)
	require.ErrorContains(t, err, `RECONCILE_RATE="500"`)
	require.ErrorContains(t, err, "nowhere to store")

	_, err = LoadReconcile(MapEnv(map[string]string{"STRIPE_API_KEY": "rk_live_abc", "STRIPE_MODE": "test", "DATABASE_URL": "postgres://x@127.0.0.1/db"}))
	require.ErrorContains(t, err, "live-mode key but STRIPE_MODE=test")
}

// The key travels in every request: http only to a stand-in on loopback.
func TestStripeAPIBaseIsHTTPSExceptOnLoopback(t *testing.T) {
	t.Parallel()
	for base, ok := range map[string]bool{
		"https://api.stripe.com": true, "https://stripe-proxy.internal:8443": true,
		"http://127.0.0.1:12111": true, "http://[::1]:12111": true, "http://localhost:12111": true,
		"http://api.stripe.com": false, "http://10.0.0.5:12111": false, "http://stripe-mock:12111": false,
	} {
		_, err := LoadReconcile(MapEnv(map[string]string{"STRIPE_API_KEY": "rk_test_abc", "DATABASE_URL": "postgres://x@127.0.0.1/db", "STRIPE_API_BASE": base}))
		if ok {
			require.NoError(t, err, base)
		} else {
			require.ErrorContains(t, err, "plain http sends the Stripe key in clear", base)
		}
	}
}

func TestLoadReconcileStore(t *testing.T) {
	t.Parallel()
	role := "arn:aws:iam::123456789012:role/StripeInbox-dev-ReconcileRole"
	c, err := LoadReconcileStore(MapEnv(map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1/db", "RECONCILE_ENDPOINTS": "billing,connect", "RECONCILER_ROLE_ARN": role}))
	require.NoError(t, err)
	require.Equal(t, []string{"billing", "connect"}, c.Endpoints)
	require.Equal(t, role, c.ReconcilerRoleARN)
	_, err = LoadReconcileStore(MapEnv(map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1/db", "RECONCILE_ENDPOINTS": "Bad Name", "RECONCILER_ROLE_ARN": role}))
	require.ErrorContains(t, err, "is not an endpoint name")
	// Without the reconciler's role it would have no one to admit.
	_, err = LoadReconcileStore(MapEnv(map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1/db"}))
	require.ErrorContains(t, err, "RECONCILER_ROLE_ARN is not set")
	_, err = LoadReconcileStore(MapEnv(map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1/db", "RECONCILER_ROLE_ARN": "arn:aws:iam::123456789012:user/bob"}))
	require.ErrorContains(t, err, "RECONCILER_ROLE_ARN: ")
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
	_, err = LoadLocal(env(map[string]string{"STRIPE_API_KEY": "rk_test_x", "RECONCILE_LOOKBACK": "45d", "RECONCILE_SETTLE": "100h", "RECONCILE_INTERVAL": "forever"}))
	require.ErrorContains(t, err, "RECONCILE_LOOKBACK=1080h0m0s")
	require.ErrorContains(t, err, "RECONCILE_SETTLE=100h0m0s")
	require.ErrorContains(t, err, `RECONCILE_INTERVAL="forever"`)
}

// The migrate function creates the store function's role when
// RECONCILE_DB_USER is set (the stack sets it), with its own password.
func TestLoadMigrateReconcileRole(t *testing.T) {
	t.Parallel()
	const password1, password2 = "first-Password-0123456789", "second-Password-9876543210"
	base := map[string]string{
		"DATABASE_URL": "postgres://master@127.0.0.1/inbox", "SCHEMA_OWNER_ROLE": "inbox_schema_owner",
		"WEBHOOK_DB_USER": "inbox_webhook", "WORKER_DB_USER": "inbox_worker", "PURGE_DB_USER": "inbox_purge",
		"WEBHOOK_DB_PASSWORD": password1, "WORKER_DB_PASSWORD": password1, "PURGE_DB_PASSWORD": password1,
	}
	env := func(extra map[string]string) Env {
		return func(k string) string {
			if v, ok := extra[k]; ok {
				return v
			}
			return base[k]
		}
	}
	c, err := LoadMigrate(env(map[string]string{"RECONCILE_DB_USER": "inbox_reconcile", "RECONCILE_DB_PASSWORD": password2}))
	require.NoError(t, err)
	require.Equal(t, "inbox_reconcile", c.Roles.Reconcile)
	require.Equal(t, password2, c.Passwords.Reconcile)

	_, err = LoadMigrate(env(map[string]string{"RECONCILE_DB_USER": "inbox_reconcile"}))
	require.ErrorContains(t, err, "no password for the reconcile's role: set RECONCILE_DB_SECRET_ARN")
	_, err = LoadMigrate(env(map[string]string{"RECONCILE_DB_PASSWORD": password2}))
	require.ErrorContains(t, err, "RECONCILE_DB_PASSWORD is set but RECONCILE_DB_USER is not")
	_, err = LoadMigrate(env(map[string]string{"RECONCILE_DB_USER": "inbox_webhook", "RECONCILE_DB_PASSWORD": password2}))
	require.ErrorContains(t, err, "each needs a role of its own")
}
