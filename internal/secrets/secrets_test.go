package secrets_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/secrets"
)

// store is a stand-in for Secrets Manager that counts fetches.
type store struct {
	mu     sync.Mutex
	values map[string]string
	fail   bool
	calls  int
}

func (s *store) fetch(_ context.Context, ref string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	if s.fail {
		return "", errors.New("service unavailable")
	}
	return s.values[ref], nil
}

type clock struct{ now time.Time }

func (c *clock) Now() time.Time { return c.now }

func TestKeyringFetchesOnceThenOnTTL(t *testing.T) {
	t.Parallel()
	st := &store{values: map[string]string{"arn:b": "whsec_one"}}
	clk := &clock{now: time.Unix(1000, 0)}
	k, err := secrets.NewKeyring(context.Background(), map[string]string{"billing": "arn:b"}, st.fetch,
		secrets.Options{TTL: time.Minute, Now: clk.Now})
	require.NoError(t, err)
	require.Equal(t, 1, st.calls)

	for range 5 {
		got, err := k.Secrets(context.Background(), "billing")
		require.NoError(t, err)
		require.Equal(t, []string{"whsec_one"}, got)
	}
	require.Equal(t, 1, st.calls, "cached within the TTL")

	st.values["arn:b"] = "whsec_two, whsec_one"
	clk.now = clk.now.Add(time.Minute)
	got, err := k.Secrets(context.Background(), "billing")
	require.NoError(t, err)
	require.Equal(t, []string{"whsec_two", "whsec_one"}, got)
	require.Equal(t, 2, st.calls)
}

func TestKeyringKeepsCachedValueWhenRefreshFails(t *testing.T) {
	t.Parallel()
	st := &store{values: map[string]string{"arn:b": "whsec_one"}}
	clk := &clock{now: time.Unix(1000, 0)}
	k, err := secrets.NewKeyring(context.Background(), map[string]string{"billing": "arn:b"}, st.fetch,
		secrets.Options{TTL: time.Minute, Now: clk.Now})
	require.NoError(t, err)
	st.fail = true
	clk.now = clk.now.Add(2 * time.Minute)
	got, err := k.Secrets(context.Background(), "billing")
	require.NoError(t, err)
	require.Equal(t, []string{"whsec_one"}, got)
	_, _ = k.Secrets(context.Background(), "billing")
	require.Equal(t, 2, st.calls, "a failed refresh is not retried on every request")
}

func TestRefreshAfterMismatchIsRateLimited(t *testing.T) {
	t.Parallel()
	st := &store{values: map[string]string{"arn:b": "whsec_one"}}
	clk := &clock{now: time.Unix(1000, 0)}
	k, err := secrets.NewKeyring(context.Background(), map[string]string{"billing": "arn:b"}, st.fetch,
		secrets.Options{TTL: time.Hour, MinRefresh: 30 * time.Second, Now: clk.Now})
	require.NoError(t, err)

	st.values["arn:b"] = "whsec_new,whsec_one"
	require.False(t, k.RefreshAfterMismatch(context.Background(), "billing"), "too soon after the last fetch")
	require.Equal(t, 1, st.calls)
	clk.now = clk.now.Add(31 * time.Second)
	require.True(t, k.RefreshAfterMismatch(context.Background(), "billing"))
	got, err := k.Secrets(context.Background(), "billing")
	require.NoError(t, err)
	require.Equal(t, []string{"whsec_new", "whsec_one"}, got)
	require.False(t, k.RefreshAfterMismatch(context.Background(), "billing"))
}

func TestKeyringStartErrorsNameTheEndpoint(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		values map[string]string
		fail   bool
		want   string
	}{
		"empty secret":     {values: map[string]string{"arn:b": "  "}, want: `endpoint "billing": it is empty`},
		"not a whsec":      {values: map[string]string{"arn:b": "sk_live_oops"}, want: "must start with whsec_"},
		"fetch fails":      {fail: true, want: `fetching the signing secret of endpoint "billing"`},
		"placeholder text": {values: map[string]string{"arn:b": "REPLACE_ME"}, want: "not a Stripe signing secret"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			st := &store{values: tc.values, fail: tc.fail}
			_, err := secrets.NewKeyring(context.Background(), map[string]string{"billing": "arn:b"}, st.fetch, secrets.Options{})
			require.ErrorContains(t, err, tc.want)
		})
	}
	_, err := secrets.NewKeyring(context.Background(), nil, secrets.Literal, secrets.Options{})
	require.ErrorContains(t, err, "no webhook endpoints")
}

func TestUnknownEndpoint(t *testing.T) {
	t.Parallel()
	k, err := secrets.NewKeyring(context.Background(), map[string]string{"billing": "whsec_x"}, secrets.Literal, secrets.Options{})
	require.NoError(t, err)
	_, err = k.Secrets(context.Background(), "connect")
	require.ErrorIs(t, err, secrets.ErrUnknownEndpoint)
	require.Equal(t, []string{"billing"}, k.Endpoints())
}
