package config

import (
	"fmt"
	"strings"
	"time"

	"github.com/stripe-inbox/inbox/internal/writeback"
)

// LocalWriteback is the local runner's write-back sender: on when the
// worker runs with WRITEBACKS set (docs/writebacks.md).
type LocalWriteback struct {
	Enabled  bool
	Client   writeback.ClientConfig
	Sender   writeback.Config
	Interval time.Duration
}

// loadLocalWriteback reads, when the worker runs with write-backs on,
// STRIPE_API_KEY (required: a key with Customers: Write), STRIPE_API_BASE
// (the API's base URL, default Stripe's; a stand-in's in tests) and
// WRITEBACK_INTERVAL (default 2s: how often the sender runs).
func (p *problems) loadLocalWriteback(env Env, l *Local) {
	if !l.Runs("worker") || len(l.Worker.Handlers.Writebacks) == 0 {
		return
	}
	w := LocalWriteback{Enabled: true}
	w.Client.Key = strings.TrimSpace(env("STRIPE_API_KEY"))
	w.Client.BaseURL = strings.TrimSpace(env("STRIPE_API_BASE"))
	if w.Client.Key == "" {
		p.addf("WRITEBACKS=%s but STRIPE_API_KEY is not set: the write-back sender needs a Stripe API key with Customers: Write (sk_test_... or rk_test_...), or set WRITEBACKS=off",
			strings.Join(l.Worker.Handlers.Writebacks, ","))
	}
	if w.Client.BaseURL != "" && !strings.HasPrefix(w.Client.BaseURL, "http://") && !strings.HasPrefix(w.Client.BaseURL, "https://") {
		p.addf("STRIPE_API_BASE=%q: must be an http(s) URL such as https://api.stripe.com or a stand-in's http://127.0.0.1:PORT", w.Client.BaseURL)
	}
	w.Interval = p.durationIn(env, "WRITEBACK_INTERVAL", 2*time.Second, 10*time.Millisecond, time.Hour)
	w.Sender = writeback.Config{}.WithDefaults()
	if err := w.Sender.Validate(); err != nil {
		p.addf("%v", err)
	}
	l.Writeback = w
}

// String is the line the local runner prints.
func (w LocalWriteback) String() string {
	base := w.Client.BaseURL
	if base == "" {
		base = "https://api.stripe.com"
	}
	return fmt.Sprintf("write-back sender running every %s against %s (WRITEBACKS, STRIPE_API_BASE)", w.Interval, base)
}
