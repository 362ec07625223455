package secrets

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestAPIKeyMode(t *testing.T) {
	t.Parallel()
	for key, mode := range map[string]string{
		"rk_live_abc": "live", "rk_test_abc": "test", "sk_live_abc": "live", "sk_test_abc": "test",
		"rk_test_": "", "pk_test_abc": "", "whsec_abc": "", "rk_test_a,rk_test_b": "", "": "",
		"PLACEHOLDER: store a Stripe restricted key": "",
	} {
		got, err := APIKeyMode(key)
		require.Equal(t, mode, got, key)
		require.Equal(t, mode == "", err != nil, key)
	}
}

func TestFetchAPIKey(t *testing.T) {
	t.Parallel()
	key, mode, err := FetchAPIKey(context.Background(), Literal, " rk_live_abc\n", time.Second)
	require.NoError(t, err)
	require.Equal(t, "rk_live_abc", key)
	require.Equal(t, "live", mode)

	_, _, err = FetchAPIKey(context.Background(), Literal, "PLACEHOLDER", time.Second)
	require.ErrorContains(t, err, "the Stripe API key's secret: it is not a Stripe API key")

	// A fetch that hangs is bounded by the timeout (the fetcher sees its
	// context end; nothing here waits on a clock).
	hang := func(ctx context.Context, _ string) (string, error) { <-ctx.Done(); return "", ctx.Err() }
	_, _, err = FetchAPIKey(context.Background(), hang, "arn", time.Millisecond)
	require.True(t, errors.Is(err, context.DeadlineExceeded), "%v", err)
}

func TestCheckRestricted(t *testing.T) {
	t.Parallel()
	require.NoError(t, CheckRestricted("rk_live_abc"))
	require.NoError(t, CheckRestricted("rk_test_abc"))
	for _, key := range []string{"sk_live_abc", "sk_test_abc"} {
		err := CheckRestricted(key)
		require.ErrorIs(t, err, ErrFullSecretKey, key)
		require.ErrorContains(t, err, "Events: Read")
		require.NotContains(t, err.Error(), key, "the key must not appear in the message")
	}
}
