package config

import (
	"strings"

	"github.com/stripe-inbox/inbox/internal/outbox"
)

// Outbox is the outbox relay's configuration, read by the worker (and the
// local runner's worker). Enabled is false when OUTBOX_BUS is empty: the
// relay is off and outbox rows stay in the table for a consumer of it.
type Outbox struct {
	Enabled bool
	Relay   outbox.Config
}

// LoadOutbox reads OUTBOX_BUS (the EventBridge bus name or ARN; empty: relay
// off), and when it is set AWS_REGION (required: the SDK's region, also how
// it finds the endpoint; AWS_ENDPOINT_URL_EVENTBRIDGE overrides the endpoint
// as usual), OUTBOX_SOURCE, OUTBOX_MAX_ATTEMPTS, OUTBOX_CLAIM_LIMIT,
// OUTBOX_LEASE, OUTBOX_CALL_TIMEOUT, OUTBOX_BACKOFF_BASE, OUTBOX_BACKOFF_CAP
// and OUTBOX_EVERY. The ranges are outbox.Config.Validate's.
func LoadOutbox(env Env) (Outbox, error) {
	var p problems
	o := Outbox{Relay: outbox.Config{Bus: strings.TrimSpace(env("OUTBOX_BUS"))}}
	if o.Relay.Bus == "" {
		for _, k := range []string{"OUTBOX_SOURCE", "OUTBOX_MAX_ATTEMPTS", "OUTBOX_CLAIM_LIMIT", "OUTBOX_LEASE", "OUTBOX_CALL_TIMEOUT", "OUTBOX_BACKOFF_BASE", "OUTBOX_BACKOFF_CAP", "OUTBOX_EVERY"} {
			if strings.TrimSpace(env(k)) != "" {
				p.addf("%s is set but OUTBOX_BUS is not: set OUTBOX_BUS to the event bus to turn the outbox relay on, or unset %s", k, k)
			}
		}
		return o, p.err()
	}
	o.Enabled = true
	if strings.TrimSpace(env("AWS_REGION")) == "" {
		p.addf("AWS_REGION is required when OUTBOX_BUS is set (the region of the event bus; Lambda sets it)")
	}
	o.Relay.Source = strings.TrimSpace(env("OUTBOX_SOURCE"))
	o.Relay.MaxAttempts = p.wholeNumber(env, "OUTBOX_MAX_ATTEMPTS", outbox.DefaultMaxAttempts)
	o.Relay.ClaimLimit = p.wholeNumber(env, "OUTBOX_CLAIM_LIMIT", outbox.DefaultClaimLimit)
	o.Relay.Lease = p.duration(env, "OUTBOX_LEASE", outbox.DefaultLease)
	o.Relay.CallTimeout = p.duration(env, "OUTBOX_CALL_TIMEOUT", outbox.DefaultCallTimeout)
	o.Relay.BackoffBase = p.duration(env, "OUTBOX_BACKOFF_BASE", outbox.DefaultBackoffBase)
	o.Relay.BackoffCap = p.duration(env, "OUTBOX_BACKOFF_CAP", outbox.DefaultBackoffCap)
	o.Relay.Every = p.duration(env, "OUTBOX_EVERY", outbox.DefaultEvery)
	if o.Relay.Source == "" {
		o.Relay.Source = outbox.DefaultSource
	}
	// Every range is checked there (a 0 is reported, not defaulted).
	if err := o.Relay.Validate(); err != nil {
		for _, line := range strings.Split(err.Error(), "\n") {
			p.addf("%s", line)
		}
	}
	return o, p.err()
}
