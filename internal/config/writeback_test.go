package config

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The writeback function: a key (a secret in AWS, the key locally), a
// store (the store function in AWS, the database locally), each exactly
// one; mistakes reported at start.
func TestLoadWriteback(t *testing.T) {
	t.Parallel()
	arn := "arn:aws:secretsmanager:eu-west-1:123456789012:secret:StripeInbox-dev-writeback-key"
	c, err := LoadWriteback(MapEnv(map[string]string{"STRIPE_API_KEY_SECRET_ARN": arn, "STORE_FUNCTION": "StripeInbox-dev-WritebackStore", "STRIPE_MODE": "live"}))
	require.NoError(t, err)
	require.True(t, c.APIKeyFromSecretsManager)
	require.Equal(t, "StripeInbox-dev-WritebackStore", c.StoreFunction)
	require.Equal(t, DefaultStripeAPIBase, c.Client.BaseURL)
	require.Equal(t, 25, c.Sender.MaxAttempts)
	require.Equal(t, "writeback", c.MetricsDimensions["Service"])

	c, err = LoadWriteback(MapEnv(map[string]string{"STRIPE_API_KEY": "rk_test_x", "DATABASE_URL": "postgres://x@127.0.0.1/db", "STRIPE_API_BASE": "http://127.0.0.1:12111/", "WRITEBACK_MAX_ATTEMPTS": "3"}))
	require.NoError(t, err)
	require.Equal(t, "http://127.0.0.1:12111", c.Client.BaseURL)
	require.Equal(t, 3, c.Sender.MaxAttempts)
	require.Equal(t, "inbox-writeback", c.Database.AppName)

	for name, tc := range map[string]struct {
		env  map[string]string
		want string
	}{
		"no key":       {map[string]string{"STORE_FUNCTION": "f"}, "no Stripe API key"},
		"two keys":     {map[string]string{"STRIPE_API_KEY": "rk_test_x", "STRIPE_API_KEY_SECRET_ARN": arn, "STORE_FUNCTION": "f"}, "not both"},
		"no store":     {map[string]string{"STRIPE_API_KEY": "rk_test_x"}, "no write-back store"},
		"two stores":   {map[string]string{"STRIPE_API_KEY": "rk_test_x", "STORE_FUNCTION": "f", "DATABASE_URL": "postgres://x@127.0.0.1/db"}, "not both"},
		"mode":         {map[string]string{"STRIPE_API_KEY": "rk_test_x", "STORE_FUNCTION": "f", "STRIPE_MODE": "live"}, "test-mode key but STRIPE_MODE=live"},
		"clear http":   {map[string]string{"STRIPE_API_KEY": "rk_test_x", "STORE_FUNCTION": "f", "STRIPE_API_BASE": "http://stripe.example"}, "plain http"},
		"attempts":     {map[string]string{"STRIPE_API_KEY": "rk_test_x", "STORE_FUNCTION": "f", "WRITEBACK_MAX_ATTEMPTS": "0"}, "WRITEBACK_MAX_ATTEMPTS"},
		"not a secret": {map[string]string{"STRIPE_API_KEY_SECRET_ARN": "rk_live_x", "STORE_FUNCTION": "f"}, "not a Secrets Manager ARN"},
	} {
		_, err := LoadWriteback(MapEnv(tc.env))
		require.ErrorContains(t, err, tc.want, name)
	}
}

func TestLoadWritebackStore(t *testing.T) {
	t.Parallel()
	role := "arn:aws:iam::123456789012:role/StripeInbox-dev-WritebackRole"
	c, err := LoadWritebackStore(MapEnv(map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1/db", "WRITEBACK_ROLE_ARN": role}))
	require.NoError(t, err)
	require.Equal(t, role, c.SenderRoleARN)
	require.Equal(t, "writebackstore", c.MetricsDimensions["Service"])
	_, err = LoadWritebackStore(MapEnv(map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1/db"}))
	require.ErrorContains(t, err, "WRITEBACK_ROLE_ARN is not set")
	_, err = LoadWritebackStore(MapEnv(map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1/db", "WRITEBACK_ROLE_ARN": "arn:aws:iam::123456789012:user/bob"}))
	require.ErrorContains(t, err, "WRITEBACK_ROLE_ARN: ")
}

// The local runner's sender: on with WRITEBACKS in a worker, its settings
// read (the fault suite shortens them), mistakes reported at start.
func TestLoadLocalWriteback(t *testing.T) {
	t.Parallel()
	base := map[string]string{
		"DATABASE_URL": "postgres://x@127.0.0.1/db", "LOCAL_COMPONENTS": "worker", "STRIPE_MODE": "test",
		"WRITEBACKS": "customer_metadata", "STRIPE_API_KEY": "sk_test_x", "STRIPE_API_BASE": "http://127.0.0.1:12111",
	}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	c, err := LoadLocal(MapEnv(base))
	require.NoError(t, err)
	require.True(t, c.Writeback.Enabled)
	require.Equal(t, 2*time.Minute, c.Writeback.Sender.Lease)
	require.Equal(t, 10*time.Second, c.Writeback.Sender.BackoffBase)

	c, err = LoadLocal(MapEnv(with("WRITEBACK_CLAIM_LIMIT", "5", "WRITEBACK_LEASE", "3s", "WRITEBACK_CALL_TIMEOUT", "1s",
		"WRITEBACK_MAX_ATTEMPTS", "100", "WRITEBACK_BACKOFF_BASE", "50ms", "WRITEBACK_BACKOFF_CAP", "1s")))
	require.NoError(t, err)
	require.Equal(t, 5, c.Writeback.Sender.ClaimLimit)
	require.Equal(t, 3*time.Second, c.Writeback.Sender.Lease)
	require.Equal(t, time.Second, c.Writeback.Sender.CallTimeout)
	require.Equal(t, 100, c.Writeback.Sender.MaxAttempts)
	require.Equal(t, 50*time.Millisecond, c.Writeback.Sender.BackoffBase)
	require.Equal(t, time.Second, c.Writeback.Sender.BackoffCap)

	_, err = LoadLocal(MapEnv(with("WRITEBACK_LEASE", "2s", "WRITEBACK_CALL_TIMEOUT", "5s")))
	require.ErrorContains(t, err, "WRITEBACK_LEASE, WRITEBACK_CALL_TIMEOUT")
	_, err = LoadLocal(MapEnv(with("WRITEBACK_MAX_ATTEMPTS", "0")))
	require.ErrorContains(t, err, "WRITEBACK_MAX_ATTEMPTS")
}
