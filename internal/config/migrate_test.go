package config_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/approle"
	"github.com/stripe-inbox/inbox/internal/config"
)

const (
	password1 = "first-Password-0123456789"
	password2 = "second-Password-9876543210"
)

const testSecretARN = "arn:aws:secretsmanager:us-east-1:000000000000:secret:app-AbCdEf"

func migrateEnv(overrides map[string]string) config.Env {
	m := map[string]string{
		"DB_PROXY_HOST":         "inbox.proxy-abc.us-east-1.rds.amazonaws.com",
		"DB_PROXY_PORT":         "5432",
		"DB_NAME":               "inbox",
		"DB_USER":               "inbox_owner",
		"AWS_REGION":            "us-east-1",
		"SCHEMA_OWNER_ROLE":     "inbox_schema_owner",
		"WEBHOOK_DB_USER":       "inbox_webhook",
		"WORKER_DB_USER":        "inbox_worker",
		"PURGE_DB_USER":         "inbox_purge",
		"WEBHOOK_DB_SECRET_ARN": testSecretARN + "webhook",
		"WORKER_DB_SECRET_ARN":  testSecretARN + "worker",
		"PURGE_DB_SECRET_ARN":   testSecretARN + "purge",
		"RETIRED_DB_USERS":      "inbox_app",
	}
	for k, v := range overrides {
		if v == "" {
			delete(m, k)
		} else {
			m[k] = v
		}
	}
	return func(k string) string { return m[k] }
}

func TestMigrate(t *testing.T) {
	t.Parallel()

	t.Run("AWS", func(t *testing.T) {
		t.Parallel()
		c, err := config.LoadMigrate(migrateEnv(nil))
		require.NoError(t, err)
		require.Equal(t, "inbox_owner", c.Database.User)
		require.Equal(t, 5432, c.Database.ProxyPort)
		require.Equal(t, approle.Roles{Owner: "inbox_schema_owner", Webhook: "inbox_webhook", Worker: "inbox_worker", Purge: "inbox_purge",
			Retired: []string{"inbox_app"}}, c.Roles)
		require.Equal(t, map[string]string{"webhook": testSecretARN + "webhook", "worker": testSecretARN + "worker", "purge": testSecretARN + "purge"},
			c.SecretARNs)
		require.Equal(t, 4*time.Minute, c.ConnectWait)
	})

	t.Run("AWS, keeping the earlier release's shared role", func(t *testing.T) {
		t.Parallel()
		c, err := config.LoadMigrate(migrateEnv(map[string]string{"RETIRED_DB_USERS": "", "LEGACY_DB_USER": "inbox_app", "LEGACY_DB_SECRET_ARN": testSecretARN + "app"}))
		require.NoError(t, err)
		require.Equal(t, "inbox_app", c.Roles.Legacy)
		require.Empty(t, c.Roles.Retired)
		require.Equal(t, testSecretARN+"app", c.SecretARNs["legacy"])
	})

	t.Run("Local", func(t *testing.T) {
		t.Parallel()
		c, err := config.LoadMigrate(func(k string) string {
			return map[string]string{
				"DATABASE_URL":        "postgres://postgres@127.0.0.1:5432/inbox?sslmode=disable",
				"SCHEMA_OWNER_ROLE":   "inbox_schema_owner",
				"WEBHOOK_DB_USER":     "inbox_webhook",
				"WORKER_DB_USER":      "inbox_worker",
				"PURGE_DB_USER":       "inbox_purge",
				"WEBHOOK_DB_PASSWORD": password1,
				"WORKER_DB_PASSWORD":  password2,
				"PURGE_DB_PASSWORD":   password1,
				"CONNECT_WAIT":        "0s",
			}[k]
		})
		require.NoError(t, err)
		require.Equal(t, approle.Passwords{Webhook: password1, Worker: password2, Purge: password1}, c.Passwords)
		require.Empty(t, c.SecretARNs)
		require.Zero(t, c.ConnectWait)
	})

	for _, tc := range []struct {
		name string
		env  map[string]string
		want []string
	}{
		{"nothing set", map[string]string{"DB_PROXY_HOST": "", "WEBHOOK_DB_USER": "", "WORKER_DB_SECRET_ARN": "", "SCHEMA_OWNER_ROLE": ""},
			[]string{"DATABASE_URL", "WEBHOOK_DB_USER is not set", "SCHEMA_OWNER_ROLE is not set", "WORKER_DB_SECRET_ARN"}},
		{"master is a function's role", map[string]string{"DB_USER": "inbox_worker"}, []string{"DB_USER", "each needs a role of its own"}},
		{"two functions share a role", map[string]string{"PURGE_DB_USER": "inbox_worker"}, []string{"each needs a role of its own"}},
		{"retired role in use", map[string]string{"RETIRED_DB_USERS": "inbox_app,inbox_webhook"}, []string{"retired role"}},
		{"bad port", map[string]string{"DB_PROXY_PORT": "99999"}, []string{"DB_PROXY_PORT"}},
		{"not an ARN", map[string]string{"PURGE_DB_SECRET_ARN": "inbox/purge"}, []string{"PURGE_DB_SECRET_ARN", "Secrets Manager ARN"}},
		{"both password sources", map[string]string{"WEBHOOK_DB_PASSWORD": password1}, []string{"WEBHOOK_DB_", "not both"}},
		{"bad role", map[string]string{"WORKER_DB_USER": "Inbox"}, []string{"lower-case"}},
		{"the earlier release's variables", map[string]string{"APP_DB_USER": "inbox_app"}, []string{"APP_DB_USER is no longer read", "RETIRED_DB_USERS"}},
		{"bad wait", map[string]string{"CONNECT_WAIT": "forever"}, []string{"CONNECT_WAIT"}},
		{"legacy role without its secret", map[string]string{"RETIRED_DB_USERS": "", "LEGACY_DB_USER": "inbox_app"},
			[]string{"no password for LEGACY_DB_USER=inbox_app", "LEGACY_DB_SECRET_ARN"}},
		{"legacy role kept and retired", map[string]string{"LEGACY_DB_USER": "inbox_app", "LEGACY_DB_SECRET_ARN": testSecretARN + "app"},
			[]string{"LEGACY_DB_USER=inbox_app is also in RETIRED_DB_USERS"}},
		{"legacy secret without the role", map[string]string{"LEGACY_DB_SECRET_ARN": testSecretARN + "app"}, []string{"LEGACY_DB_USER is not"}},
		{"legacy role is a function's", map[string]string{"RETIRED_DB_USERS": "", "LEGACY_DB_USER": "inbox_worker", "LEGACY_DB_PASSWORD": password1},
			[]string{"each needs a role of its own"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := config.LoadMigrate(migrateEnv(tc.env))
			require.Error(t, err)
			for _, w := range tc.want {
				require.ErrorContains(t, err, w)
			}
		})
	}
}
