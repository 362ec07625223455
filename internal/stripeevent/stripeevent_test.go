package stripeevent_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/stripeevent"
	"github.com/stripe-inbox/inbox/internal/stripetest"
)

// header signs body with the independent signer (stripetest.Sign, written
// from Stripe's documented scheme), not with stripe-go, which Verify uses.
func header(body []byte, secret string, at time.Time) string {
	return stripetest.Sign(body, at, secret)
}

func TestVerifyExtractsFields(t *testing.T) {
	t.Parallel()
	body := []byte(`{"id":"evt_1","type":"charge.refunded","api_version":"2024-06-20","livemode":true,"account":"acct_1","data":{"object":{"id":"ch_1"}}}`)
	ev, err := stripeevent.Verify(body, header(body, "whsec_a", time.Now()), []string{"whsec_b", "whsec_a"})
	require.NoError(t, err)
	require.Equal(t, stripeevent.Event{
		ID: "evt_1", Type: "charge.refunded", APIVersion: "2024-06-20", Livemode: true,
		Account: "acct_1", ObjectID: "ch_1", Payload: body,
	}, ev)
}

func TestVerifyErrors(t *testing.T) {
	t.Parallel()
	body := []byte(`{"id":"evt_1","type":"x"}`)
	now := time.Now()
	cases := map[string]struct {
		body    []byte
		header  string
		secrets []string
		want    error
	}{
		"no secrets":      {body, header(body, "whsec_a", now), nil, stripeevent.ErrNoSecrets},
		"no header":       {body, "", []string{"whsec_a"}, stripeevent.ErrNotSigned},
		"wrong secret":    {body, header(body, "whsec_a", now), []string{"whsec_b"}, stripeevent.ErrBadSignature},
		"malformed":       {body, "t=abc,v1=00", []string{"whsec_a"}, stripeevent.ErrBadSignature},
		"too old":         {body, header(body, "whsec_a", now.Add(-6*time.Minute)), []string{"whsec_a"}, stripeevent.ErrTooOld},
		"not an object":   {[]byte(`"x"`), header([]byte(`"x"`), "whsec_a", now), []string{"whsec_a"}, stripeevent.ErrMalformed},
		"empty id":        {[]byte(`{"id":"","type":"x"}`), header([]byte(`{"id":"","type":"x"}`), "whsec_a", now), []string{"whsec_a"}, stripeevent.ErrMalformed},
		"control in type": {[]byte(`{"id":"e","type":"a\tb"}`), header([]byte(`{"id":"e","type":"a\tb"}`), "whsec_a", now), []string{"whsec_a"}, stripeevent.ErrMalformed},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := stripeevent.Verify(tc.body, tc.header, tc.secrets)
			require.ErrorIs(t, err, tc.want)
		})
	}
}

func TestVerifyAcceptsWithinTolerance(t *testing.T) {
	t.Parallel()
	body := []byte(`{"id":"evt_1","type":"x"}`)
	_, err := stripeevent.Verify(body, header(body, "whsec_a", time.Now().Add(-4*time.Minute)), []string{"whsec_a"})
	require.NoError(t, err)
}

// TestVerifyAcceptsTextJSONBRefuses: an escaped NUL or a lone surrogate is
// valid JSON; a verified event carrying one is accepted with its exact bytes
// (internal/inbox stores it losslessly).
func TestVerifyAcceptsTextJSONBRefuses(t *testing.T) {
	t.Parallel()
	for _, body := range [][]byte{
		[]byte(`{"id":"evt_1","type":"x","data":{"object":{"name":"a\u0000b"}}}`),
		[]byte(`{"id":"evt_1","type":"x","data":{"object":{"name":"\ud800"}}}`),
	} {
		ev, err := stripeevent.Verify(body, header(body, "whsec_a", time.Now()), []string{"whsec_a"})
		require.NoError(t, err, "%s", body)
		require.Equal(t, body, ev.Payload)
	}
}
