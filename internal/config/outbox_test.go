package config_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/config"
	"github.com/stripe-inbox/inbox/internal/outbox"
)

func TestOutboxRelayIsOffWithoutABus(t *testing.T) {
	t.Parallel()
	c, err := config.LoadOutbox(env())
	require.NoError(t, err)
	require.False(t, c.Enabled)

	// A relay setting without the bus is a mistake, not ignored.
	_, err = config.LoadOutbox(env("OUTBOX_LEASE", "5m"))
	require.ErrorContains(t, err, "OUTBOX_LEASE is set but OUTBOX_BUS is not")
}

func TestOutboxRelayDefaultsAndSettings(t *testing.T) {
	t.Parallel()
	c, err := config.LoadOutbox(env("OUTBOX_BUS", "stripe-inbox-dev", "AWS_REGION", "eu-west-1"))
	require.NoError(t, err)
	require.True(t, c.Enabled)
	require.Equal(t, outbox.Config{Bus: "stripe-inbox-dev"}.WithDefaults(), c.Relay)

	c, err = config.LoadOutbox(env("OUTBOX_BUS", "stripe-inbox-dev", "AWS_REGION", "eu-west-1", "OUTBOX_SOURCE", "billing",
		"OUTBOX_MAX_ATTEMPTS", "20", "OUTBOX_CLAIM_LIMIT", "100", "OUTBOX_LEASE", "5m", "OUTBOX_CALL_TIMEOUT", "10s",
		"OUTBOX_BACKOFF_BASE", "2s", "OUTBOX_BACKOFF_CAP", "10m", "OUTBOX_EVERY", "1s"))
	require.NoError(t, err)
	require.Equal(t, outbox.Config{Bus: "stripe-inbox-dev", Source: "billing", MaxAttempts: 20, ClaimLimit: 100, Lease: 5 * time.Minute,
		CallTimeout: 10 * time.Second, BackoffBase: 2 * time.Second, BackoffCap: 10 * time.Minute, Every: time.Second}, c.Relay)
}

func TestOutboxRelayMistakesAreAllNamed(t *testing.T) {
	t.Parallel()
	_, err := config.LoadOutbox(env("OUTBOX_BUS", "has spaces", "OUTBOX_MAX_ATTEMPTS", "0", "OUTBOX_CLAIM_LIMIT", "many",
		"OUTBOX_LEASE", "10s", "OUTBOX_EVERY", "0s"))
	require.Error(t, err)
	for _, want := range []string{
		"AWS_REGION is required when OUTBOX_BUS is set",
		`OUTBOX_BUS="has spaces"`,
		"OUTBOX_MAX_ATTEMPTS=0: must be from 1 to 1000",
		`OUTBOX_CLAIM_LIMIT="many": must be a whole number`,
		"OUTBOX_LEASE=10s must exceed",
		"OUTBOX_EVERY=0s: must be from 10ms",
	} {
		require.ErrorContains(t, err, want)
	}
}
