package config_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/config"
)

// A deployment without an ops function has no ops role, and a password for
// one without its name is refused.
func TestMigrateOpsRoleIsOptional(t *testing.T) {
	t.Parallel()
	base := map[string]string{
		"DATABASE_URL": "postgres://master@127.0.0.1:5432/inbox", "SCHEMA_OWNER_ROLE": "inbox_schema_owner",
		"WEBHOOK_DB_USER": "inbox_webhook", "WORKER_DB_USER": "inbox_worker", "PURGE_DB_USER": "inbox_purge",
		"WEBHOOK_DB_PASSWORD": "webhook-Password-0123456789", "WORKER_DB_PASSWORD": "worker-Password-0123456789", "PURGE_DB_PASSWORD": "purge-Password-0123456789",
	}
	env := func(extra map[string]string) func(string) string {
		return func(k string) string {
			if v, ok := extra[k]; ok {
				return v
			}
			return base[k]
		}
	}
	c, err := config.LoadMigrate(env(nil))
	require.NoError(t, err)
	require.Empty(t, c.Roles.Ops)
	c, err = config.LoadMigrate(env(map[string]string{"OPS_DB_USER": "inbox_ops", "OPS_DB_PASSWORD": "ops-Password-0123456789"}))
	require.NoError(t, err)
	require.Equal(t, "inbox_ops", c.Roles.Ops)
	require.Equal(t, "ops-Password-0123456789", c.Passwords.Ops)
	_, err = config.LoadMigrate(env(map[string]string{"OPS_DB_USER": "inbox_ops"}))
	require.ErrorContains(t, err, "no password for OPS_DB_USER=inbox_ops")
	_, err = config.LoadMigrate(env(map[string]string{"OPS_DB_PASSWORD": "ops-Password-0123456789"}))
	require.ErrorContains(t, err, "OPS_DB_PASSWORD is set but OPS_DB_USER is not")
	_, err = config.LoadMigrate(env(map[string]string{"OPS_DB_USER": "inbox_worker", "OPS_DB_PASSWORD": "ops-Password-0123456789"}))
	require.ErrorContains(t, err, "each needs a role of its own")
}

func TestOpsErrorsSayWhatToFix(t *testing.T) {
	t.Parallel()
	env := map[string]string{"DATABASE_URL": "postgres://u@127.0.0.1:5432/inbox"}
	c, err := config.LoadOps(config.MapEnv(env))
	require.NoError(t, err)
	require.Equal(t, 10, c.Ops.MaxAttempts)
	require.Empty(t, c.Ops.APIVersion)
	env["MAX_ATTEMPTS"], env["STRIPE_API_VERSION"] = "0", "latest"
	_, err = config.LoadOps(config.MapEnv(env))
	require.ErrorContains(t, err, "MAX_ATTEMPTS=0: must be from 1 to 1000")
	require.ErrorContains(t, err, `STRIPE_API_VERSION: "latest" is not a Stripe API version`)
	env["MAX_ATTEMPTS"], env["STRIPE_API_VERSION"] = "25", "2025-03-31.basil"
	c, err = config.LoadOps(config.MapEnv(env))
	require.NoError(t, err)
	require.Equal(t, 25, c.Ops.MaxAttempts)
}

// OUTBOX_MAX_ATTEMPTS is the relay's, so that inboxctl's outbox rows
// waiting for a human are the relay's: the same default and range.
func TestOpsReadsTheRelaysMaxAttempts(t *testing.T) {
	t.Parallel()
	env := map[string]string{"DATABASE_URL": "postgres://u@127.0.0.1:5432/inbox"}
	c, err := config.LoadOps(config.MapEnv(env))
	require.NoError(t, err)
	require.Equal(t, 10, c.Ops.OutboxMaxAttempts)
	env["OUTBOX_MAX_ATTEMPTS"] = "3"
	c, err = config.LoadOps(config.MapEnv(env))
	require.NoError(t, err)
	require.Equal(t, 3, c.Ops.OutboxMaxAttempts)
	for v, says := range map[string]string{
		"0":    "OUTBOX_MAX_ATTEMPTS=0: must be from 1 to 1000",
		"1001": "OUTBOX_MAX_ATTEMPTS=1001: must be from 1 to 1000",
		"many": `OUTBOX_MAX_ATTEMPTS="many": must be a whole number`,
	} {
		env["OUTBOX_MAX_ATTEMPTS"] = v
		_, err = config.LoadOps(config.MapEnv(env))
		require.ErrorContains(t, err, says)
	}
}
