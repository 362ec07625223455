package config_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/config"
	"github.com/stripe-inbox/inbox/internal/retention"
)

func TestPurgeDefaults(t *testing.T) {
	t.Parallel()
	c, err := config.LoadPurge(env("DATABASE_URL", localDB))
	require.NoError(t, err)
	require.Equal(t, retention.Config{Retention: 30 * 24 * time.Hour, BatchSize: 1000, ScrubAfter: 0, DeadlineMargin: 10 * time.Second}, c.Purge)
	require.EqualValues(t, 2, c.Database.MaxConns)
	require.Equal(t, "inbox-purge", c.Database.AppName)
	require.Equal(t, "purge", c.MetricsDimensions["Service"])
}

func TestPurgeSettings(t *testing.T) {
	t.Parallel()
	c, err := config.LoadPurge(env("DATABASE_URL", localDB, "RETENTION_DAYS", "45", "PURGE_BATCH_SIZE", "5000",
		"SCRUB_PAYLOAD_AFTER_DAYS", "7", "DEADLINE_MARGIN", "30s"))
	require.NoError(t, err)
	require.Equal(t, retention.Config{Retention: 45 * 24 * time.Hour, BatchSize: 5000, ScrubAfter: 7 * 24 * time.Hour, DeadlineMargin: 30 * time.Second}, c.Purge)

	// The shortest allowed: one day past Stripe's retry window, both.
	c, err = config.LoadPurge(env("DATABASE_URL", localDB, "RETENTION_DAYS", "5", "SCRUB_PAYLOAD_AFTER_DAYS", "4"))
	require.NoError(t, err)
	require.Equal(t, 5*24*time.Hour, c.Purge.Retention)
	require.Equal(t, 4*24*time.Hour, c.Purge.ScrubAfter)
}

func TestPurgeErrorsSayWhatToFix(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		env  config.Env
		want []string
	}{
		"retention inside Stripe's retry window": {env("DATABASE_URL", localDB, "RETENTION_DAYS", "3"),
			[]string{"RETENTION_DAYS=3: must be at least 4 days", "Stripe retries a webhook for up to 3 days", "a late retry be processed again"}},
		"retention zero": {env("DATABASE_URL", localDB, "RETENTION_DAYS", "0"), []string{"RETENTION_DAYS=0: must be at least 4 days"}},
		"retention not a number": {env("DATABASE_URL", localDB, "RETENTION_DAYS", "30d"),
			[]string{`RETENTION_DAYS="30d": must be a whole number (default 30)`}},
		"batch size": {env("DATABASE_URL", localDB, "PURGE_BATCH_SIZE", "0"),
			[]string{`PURGE_BATCH_SIZE=0: must be from 1 to 100000`}},
		"batch size too big": {env("DATABASE_URL", localDB, "PURGE_BATCH_SIZE", "1000000"), []string{`PURGE_BATCH_SIZE=1000000: must be from 1 to 100000`}},
		"scrub not before retention": {env("DATABASE_URL", localDB, "RETENTION_DAYS", "30", "SCRUB_PAYLOAD_AFTER_DAYS", "30"),
			[]string{"SCRUB_PAYLOAD_AFTER_DAYS=30 must be shorter than RETENTION_DAYS=30"}},
		"scrub after retention": {env("DATABASE_URL", localDB, "RETENTION_DAYS", "10", "SCRUB_PAYLOAD_AFTER_DAYS", "12"),
			[]string{"SCRUB_PAYLOAD_AFTER_DAYS=12 must be shorter than RETENTION_DAYS=10"}},
		"scrub inside Stripe's retry window": {env("DATABASE_URL", localDB, "SCRUB_PAYLOAD_AFTER_DAYS", "2"),
			[]string{"SCRUB_PAYLOAD_AFTER_DAYS=2: must be 0 (off) or at least 4 days"}},
		"scrub negative":  {env("DATABASE_URL", localDB, "SCRUB_PAYLOAD_AFTER_DAYS", "-1"), []string{`SCRUB_PAYLOAD_AFTER_DAYS=-1: must be 0 (off) or at least 4 days`}},
		"deadline margin": {env("DATABASE_URL", localDB, "DEADLINE_MARGIN", "soon"), []string{`DEADLINE_MARGIN="soon"`}},
		"no database":     {env(), []string{"set DATABASE_URL (local) or DB_PROXY_HOST"}},
		"all at once": {env("RETENTION_DAYS", "2", "PURGE_BATCH_SIZE", "x", "DB_MAX_CONNS", "0"),
			[]string{"RETENTION_DAYS=2", `PURGE_BATCH_SIZE="x"`, `DB_MAX_CONNS=0`, "set DATABASE_URL"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := config.LoadPurge(tc.env)
			require.Error(t, err)
			for _, w := range tc.want {
				require.ErrorContains(t, err, w)
			}
		})
	}
}
