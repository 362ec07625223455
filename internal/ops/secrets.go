package ops

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/stripe-inbox/inbox/internal/inbox"
)

// SecretsReport is, per endpoint, which signing secrets (by fingerprint)
// verified the deliveries received over the window.
type SecretsReport struct {
	WindowSeconds float64           `json:"window_seconds"`
	Since         time.Time         `json:"since"`
	Secrets       []inbox.SecretUse `json:"secrets"`
}

func (o *Ops) secrets(ctx context.Context, r Request) (*SecretsReport, error) {
	w, err := window(r.Window)
	if err != nil {
		return nil, err
	}
	since := o.Now().UTC().Add(-w)
	uses, err := inbox.SecretsSince(ctx, o.Pool, since)
	if err != nil {
		return nil, err
	}
	return &SecretsReport{WindowSeconds: w.Seconds(), Since: since, Secrets: uses}, nil
}

// window parses a secrets window: a Go duration (36h) or whole days (7d).
func window(s string) (time.Duration, error) {
	if s == "" {
		return DefaultWindow, nil
	}
	d, err := time.ParseDuration(s)
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, nerr := strconv.Atoi(days)
		d, err = time.Duration(n)*24*time.Hour, nerr
	}
	if err != nil || d < MinWindow || d > MaxWindow {
		return 0, invalidf("--window %q: use a duration from %s to %s such as 24h or 7d", s, MinWindow, "90d")
	}
	return d, nil
}
