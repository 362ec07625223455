package config_test

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/config"
)

// loaders are every function's loader, each given a valid environment plus
// the extra variables.
var loaders = map[string]func(extra ...string) error{
	"webhook": func(extra ...string) error {
		_, err := config.LoadWebhook(env(append([]string{"DATABASE_URL", localDB, "STRIPE_WEBHOOK_SECRET", "whsec_a"}, extra...)...))
		return err
	},
	"worker": func(extra ...string) error {
		_, err := config.LoadWorker(env(append([]string{"DATABASE_URL", localDB, "STRIPE_MODE", "test"}, extra...)...))
		return err
	},
	"purge": func(extra ...string) error {
		_, err := config.LoadPurge(env(append([]string{"DATABASE_URL", localDB}, extra...)...))
		return err
	},
	"migrate": func(extra ...string) error {
		m := map[string]string{}
		for _, k := range []string{"DB_PROXY_HOST", "DB_PROXY_PORT", "DB_NAME", "DB_USER", "AWS_REGION", "SCHEMA_OWNER_ROLE",
			"WEBHOOK_DB_USER", "WORKER_DB_USER", "PURGE_DB_USER", "WEBHOOK_DB_SECRET_ARN", "WORKER_DB_SECRET_ARN", "PURGE_DB_SECRET_ARN"} {
			m[k] = migrateEnv(nil)(k)
		}
		for i := 0; i+1 < len(extra); i += 2 {
			m[extra[i]] = extra[i+1]
		}
		_, err := config.LoadMigrate(config.MapEnv(m))
		return err
	},
	"local": func(extra ...string) error {
		_, err := config.LoadLocal(env(append([]string{"DATABASE_URL", localDB, "STRIPE_WEBHOOK_SECRET", "whsec_a"}, extra...)...))
		return err
	},
}

// TestInvalidLogLevelIsRefusedByEveryLoader: a typo in LOG_LEVEL fails the
// start of every function with a message saying what to put there.
func TestInvalidLogLevelIsRefusedByEveryLoader(t *testing.T) {
	t.Parallel()
	for name, load := range loaders {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			require.NoError(t, load(), "the base environment is valid")
			for _, ok := range []string{"debug", "INFO", "warn", "error", ""} {
				require.NoError(t, load("LOG_LEVEL", ok), ok)
			}
			for _, bad := range []string{"verbose", "warning", "debug+2", "-4"} {
				require.ErrorContains(t, load("LOG_LEVEL", bad), `LOG_LEVEL="`+bad+`": must be debug, info, warn or error (default info)`)
			}
		})
	}
}

func TestLogLevel(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]slog.Level{"": slog.LevelInfo, "Debug": slog.LevelDebug, " warn ": slog.LevelWarn, "ERROR": slog.LevelError} {
		got, err := config.LogLevel(env("LOG_LEVEL", raw))
		require.NoError(t, err)
		require.Equal(t, want, got, raw)
	}
}

// TestRangesAreCheckedByThePackageThatOwnsThem: a value that parses but is
// out of range is reported once, by the owning package's Validate (worker,
// retention, database), with the variable's name; the loaders only parse.
func TestRangesAreCheckedByThePackageThatOwnsThem(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		loader string
		env    []string
		want   string
	}{
		{"worker", []string{"LEASE", "2h"}, "LEASE=2h0m0s: must be from 1s to 1h"},
		{"worker", []string{"STATEMENT_TIMEOUT", "20m", "LEASE", "1h"}, "STATEMENT_TIMEOUT=20m0s: must be from 10ms to 15m"},
		{"worker", []string{"DEADLINE_MARGIN", "500ms", "STATEMENT_TIMEOUT", "100ms"}, "DEADLINE_MARGIN=500ms: must be from 1s to 15m"},
		{"worker", []string{"BACKOFF_BASE", "1ms"}, "BACKOFF_BASE=1ms: must be from 10ms to 1h"},
		{"worker", []string{"BACKOFF_CAP", "48h"}, "BACKOFF_BASE=2s and BACKOFF_CAP=48h0m0s: need 0 < base <= cap <= 24h"},
		{"worker", []string{"MAX_ATTEMPTS", "0"}, "MAX_ATTEMPTS=0: must be from 1 to 1000"},
		{"worker", []string{"WORKER_CONCURRENCY", "65"}, "WORKER_CONCURRENCY=65: must be from 1 to 64"},
		{"worker", []string{"DB_MAX_CONNS", "101", "WORKER_CONCURRENCY", "1"}, "DB_MAX_CONNS=101: the pool needs from 1 to 100 connections"},
		{"purge", []string{"RETENTION_DAYS", "4000"}, "RETENTION_DAYS=4000: must be at most 3650 days"},
		{"purge", []string{"RETENTION_DAYS", "99999999999999"}, "RETENTION_DAYS=99999999999999: far too many days"},
		{"purge", []string{"DEADLINE_MARGIN", "0s"}, "DEADLINE_MARGIN=0s: must be from 1s to 15m"},
		{"migrate", []string{"DB_PROXY_PORT", "70000"}, "DB_PROXY_PORT=70000: must be a TCP port from 1 to 65535"},
		{"migrate", []string{"CONNECT_WAIT", "20m"}, `CONNECT_WAIT="20m": must be a duration such as 30s or 5m, from 0s to 14m0s (default 4m0s)`},
	} {
		err := loaders[tc.loader](tc.env...)
		require.ErrorContains(t, err, tc.want, "%s %v", tc.loader, tc.env)
		name := strings.SplitN(tc.want, "=", 2)[0]
		n := 0
		for _, line := range strings.Split(err.Error(), "\n") {
			if strings.HasPrefix(strings.TrimPrefix(strings.TrimPrefix(line, "  - "), "database: "), name+"=") {
				n++
			}
		}
		require.Equal(t, 1, n, "reported once: %v", err)
	}
}

// TestEveryMistakeIsALineOfItsOwn: errors joined by a package's Validate
// are listed one per line, like the loader's own.
func TestEveryMistakeIsALineOfItsOwn(t *testing.T) {
	t.Parallel()
	err := loaders["worker"]("MAX_ATTEMPTS", "0", "CLAIM_LIMIT", "5000", "BATCH_SIZE", "10", "LEASE", "2h", "DB_MAX_CONNS", "0")
	require.Error(t, err)
	lines := strings.Split(err.Error(), "\n")
	require.Equal(t, "invalid configuration:", lines[0])
	for _, l := range lines[1:] {
		require.True(t, strings.HasPrefix(l, "  - "), "%q in\n%v", l, err)
	}
	require.GreaterOrEqual(t, len(lines), 5, "%v", err)
}
