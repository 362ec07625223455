package config

import (
	"testing"

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
