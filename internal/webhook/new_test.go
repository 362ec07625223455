package webhook_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/secrets"
	"github.com/stripe-inbox/inbox/internal/webhook"
)

// TestNewValidates: as worker.New, New fills the defaults and refuses a
// configuration outside its ranges, or a missing dependency, saying what to
// fix; it never returns a handler for it.
func TestNewValidates(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	keyring, err := secrets.NewKeyring(context.Background(), map[string]string{"billing": secretA}, secrets.Literal, secrets.Options{})
	require.NoError(t, err)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))

	h, err := webhook.New(db.Pool, keyring, webhook.Config{}, logger, nil)
	require.NoError(t, err, "the zero values take the defaults")
	require.NotNil(t, h)

	for name, tc := range map[string]struct {
		cfg  webhook.Config
		want []string
	}{
		"body limit too small": {webhook.Config{MaxBodyBytes: 10}, []string{"invalid webhook configuration", "MAX_BODY_BYTES=10: must be from 1024 to 6000000"}},
		"body limit too large": {webhook.Config{MaxBodyBytes: webhook.FunctionURLMaxPayload + 1}, []string{"MAX_BODY_BYTES=6000001"}},
		"negative timeout":     {webhook.Config{StoreTimeout: -time.Second}, []string{"STORE_TIMEOUT=-1s: must be from 100ms to 1m0s"}},
		"two mistakes":         {webhook.Config{MaxBodyBytes: 1, StoreTimeout: time.Hour}, []string{"MAX_BODY_BYTES=1", "STORE_TIMEOUT=1h0m0s"}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h, err := webhook.New(db.Pool, keyring, tc.cfg, logger, nil)
			require.Nil(t, h)
			for _, want := range tc.want {
				require.ErrorContains(t, err, want)
			}
		})
	}
	_, err = webhook.New(nil, nil, webhook.Config{}, nil, nil)
	require.ErrorContains(t, err, "no database")
	require.ErrorContains(t, err, "no signing-secret keyring")
	require.ErrorContains(t, err, "no logger")
}
