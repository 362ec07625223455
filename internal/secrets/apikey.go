package secrets

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// APIKeyMode returns "live" or "test" for a Stripe API key's text (a
// restricted key rk_live_/rk_test_, or a secret key sk_live_/sk_test_), and
// an error saying what to store when it is neither (the stack's placeholder
// included). The reconciler needs only read access to events: create a
// restricted key with "Events: Read" in the Stripe dashboard.
func APIKeyMode(key string) (string, error) {
	for _, prefix := range []string{"rk_", "sk_"} {
		for _, mode := range []string{"live", "test"} {
			p := prefix + mode + "_"
			if strings.HasPrefix(key, p) && len(key) > len(p) && !strings.ContainsAny(key, " ,\n\r\t") {
				return mode, nil
			}
		}
	}
	return "", errors.New("it is not a Stripe API key: store a restricted key with read access to events (rk_live_... or rk_test_...; Stripe dashboard → Developers → API keys → Create restricted key, Events: Read)")
}

// FetchAPIKey reads the Stripe API key that ref names (a Secrets Manager ARN
// with fetch = SecretsManager, or the key itself with Literal) within
// timeout, and checks its shape.
func FetchAPIKey(ctx context.Context, fetch Fetcher, ref string, timeout time.Duration) (key, mode string, err error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	text, err := fetch(ctx, ref)
	if err != nil {
		return "", "", fmt.Errorf("fetching the Stripe API key: %w", err)
	}
	key = strings.TrimSpace(text)
	mode, err = APIKeyMode(key)
	if err != nil {
		return "", "", fmt.Errorf("the Stripe API key's secret: %w", err)
	}
	return key, mode, nil
}

// ErrFullSecretKey means a full secret key (sk_) was stored where only a
// restricted key is accepted.
var ErrFullSecretKey = errors.New("a full Stripe secret key (sk_...) is not accepted here")

// CheckRestricted refuses a full secret key: it can do everything on the
// Stripe account (charges, refunds, payouts, other keys), so a leak of the
// reconciler's key would reach all of it. The reconciler only lists events
// (GET /v1/events), which a restricted key with "Events: Read" allows
// (https://docs.stripe.com/keys/restricted-api-keys).
func CheckRestricted(key string) error {
	if strings.HasPrefix(key, "sk_") {
		return fmt.Errorf("%w: create a restricted key (rk_...) with only Events: Read (Stripe dashboard → Developers → API keys → Create restricted key), store it in the secret, and roll the sk_ key if it may have been exposed", ErrFullSecretKey)
	}
	return nil
}
