package config

import (
	"regexp"
	"strings"
	"time"

	"github.com/stripe-inbox/inbox/internal/secrets"
	"github.com/stripe-inbox/inbox/internal/wake"
	"github.com/stripe-inbox/inbox/internal/webhook"
)

// EndpointName is the shape of an endpoint name: it is the URL path and part
// of the inbox key.
var EndpointName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// Webhook is the webhook function's configuration.
type Webhook struct {
	Common
	// Endpoints maps each endpoint name to its secret reference: a Secrets
	// Manager ARN (FromSecretsManager) or the literal signing secret(s).
	Endpoints          map[string]string
	FromSecretsManager bool
	SecretTTL          time.Duration
	// SecretFetchTimeout bounds each Secrets Manager fetch of a signing
	// secret (SECRET_FETCH_TIMEOUT).
	SecretFetchTimeout time.Duration
	Handler            webhook.Config
	// WakeFunction, when set, is the worker function the webhook invokes
	// asynchronously after each new receipt commits (WAKE_FUNCTION; the
	// stack sets it with workerWake=true); WakeTimeout bounds that Invoke
	// (WAKE_TIMEOUT, default 1s, 100ms to 5s). See internal/wake.
	WakeFunction string
	WakeTimeout  time.Duration
}

// LoadWebhook reads the webhook's configuration.
//
// Signing secrets come from exactly one of:
//   - SIGNING_SECRET_ARNS: name=arn pairs separated by commas (AWS), e.g.
//     billing=arn:aws:secretsmanager:...,connect=arn:aws:secretsmanager:...
//   - STRIPE_WEBHOOK_SECRET (one whsec_ value, or several separated by commas
//     during a roll) for the single endpoint WEBHOOK_ENDPOINT (default
//     billing): local runs.
func LoadWebhook(env Env) (Webhook, error) {
	var p problems
	w := Webhook{Common: p.common(env, "webhook", 2), Endpoints: map[string]string{}}
	arns := strings.TrimSpace(env("SIGNING_SECRET_ARNS"))
	literal := strings.TrimSpace(env("STRIPE_WEBHOOK_SECRET"))
	switch {
	case arns != "" && literal != "":
		p.addf("set either SIGNING_SECRET_ARNS (AWS) or STRIPE_WEBHOOK_SECRET (local), not both")
	case arns != "":
		w.FromSecretsManager = true
		for _, pair := range strings.Split(arns, ",") {
			name, arn, ok := strings.Cut(strings.TrimSpace(pair), "=")
			switch {
			case !ok || !EndpointName.MatchString(name):
				p.addf("SIGNING_SECRET_ARNS: %q must be endpoint=arn with an endpoint name of lower-case letters, digits, - and _", pair)
			case !strings.HasPrefix(arn, "arn:") || !strings.Contains(arn, ":secretsmanager:"):
				p.addf("SIGNING_SECRET_ARNS: endpoint %q: %q is not a Secrets Manager ARN", name, arn)
			case w.Endpoints[name] != "":
				p.addf("SIGNING_SECRET_ARNS: endpoint %q is listed twice", name)
			default:
				w.Endpoints[name] = arn
			}
		}
	case literal != "":
		name := strings.TrimSpace(env("WEBHOOK_ENDPOINT"))
		if name == "" {
			name = "billing"
		}
		if !EndpointName.MatchString(name) {
			p.addf("WEBHOOK_ENDPOINT=%q: must be lower-case letters, digits, - and _ (it is the URL path)", name)
		}
		if _, err := secrets.Parse(literal); err != nil {
			p.addf("STRIPE_WEBHOOK_SECRET: %v", err)
		}
		w.Endpoints[name] = literal
	default:
		p.addf("no signing secret: set STRIPE_WEBHOOK_SECRET=whsec_... (local) or SIGNING_SECRET_ARNS=billing=arn:aws:secretsmanager:... (AWS)")
	}
	w.SecretTTL = p.durationIn(env, "SECRET_TTL", 5*time.Minute, 10*time.Second, time.Hour)
	// At most 5s: with STORE_TIMEOUT's default 5s, a hanging Secrets Manager
	// and a slow commit still answer within the function's 10s timeout.
	w.SecretFetchTimeout = p.durationIn(env, "SECRET_FETCH_TIMEOUT", secrets.DefaultFetchTimeout, 100*time.Millisecond, 5*time.Second)
	w.Handler.MaxBodyBytes = p.intIn(env, "MAX_BODY_BYTES", webhook.DefaultMaxBodyBytes, webhook.MinBodyBytes, webhook.FunctionURLMaxPayload)
	w.Handler.StoreTimeout = p.durationIn(env, "STORE_TIMEOUT", webhook.DefaultStoreTimeout, webhook.MinStoreTimeout, webhook.MaxStoreTimeout)
	// NOTIFY=on: the receipt's INSERT also notifies resident workers
	// (inbox.StoreAndNotify). Off by default: notifying commits run one at a
	// time (see internal/inbox/queries.go), and polling alone meets the
	// latency goal.
	w.Handler.Notify = p.onOff(env, "NOTIFY", false)
	w.WakeFunction, w.WakeTimeout = p.wake(env)
	return w, p.err()
}

// wake reads WAKE_FUNCTION (the worker function to invoke after receipts
// commit; empty: none) and WAKE_TIMEOUT (bounds that Invoke).
func (p *problems) wake(env Env) (string, time.Duration) {
	return strings.TrimSpace(env("WAKE_FUNCTION")), p.durationIn(env, "WAKE_TIMEOUT", wake.DefaultTimeout, 100*time.Millisecond, 5*time.Second)
}
