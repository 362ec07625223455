package stripetest_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v82/webhook"

	"github.com/stripe-inbox/inbox/internal/stripetest"
)

// TestSignFollowsStripesScheme checks the independent signer against values
// computed outside Go (Python's hmac.new(secret, b"<t>.<payload>",
// hashlib.sha256).hexdigest()), per Stripe's "Verify webhook signatures
// manually": t=<timestamp>, then one v1=<hex HMAC-SHA256> per secret.
func TestSignFollowsStripesScheme(t *testing.T) {
	t.Parallel()
	at := time.Unix(1764633600, 0)
	payload := []byte(`{"id":"evt_1"}`)
	require.Equal(t, "t=1764633600,v1=fa5bcb43f4afb49edb3ba50bfc5e3e7f2e8a1507416ce98c6c54eb322109893d",
		stripetest.Sign(payload, at, "whsec_test"))
	require.Equal(t, "t=1764633600,v1=fa5bcb43f4afb49edb3ba50bfc5e3e7f2e8a1507416ce98c6c54eb322109893d"+
		",v1=cdea9b4c37648a769bc8f2864f10dc38a63c4a52a17fc69b027801a732a254fd",
		stripetest.Sign(payload, at, "whsec_test", "whsec_other"))
}

// TestStripeGoAcceptsTheIndependentSignature: the two implementations,
// written apart, agree (stripe-go v82 webhook.ValidatePayload is what
// internal/stripeevent verifies with).
func TestStripeGoAcceptsTheIndependentSignature(t *testing.T) {
	t.Parallel()
	payload := []byte(`{"id":"evt_1","type":"invoice.paid"}`)
	require.NoError(t, webhook.ValidatePayload(payload, stripetest.Sign(payload, time.Now(), "whsec_a"), "whsec_a"))
	require.Error(t, webhook.ValidatePayload(payload, stripetest.Sign(payload, time.Now(), "whsec_b"), "whsec_a"))
}
