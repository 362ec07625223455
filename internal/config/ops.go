package config

import (
	"strings"

	"github.com/stripe-inbox/inbox/internal/stripeevent"
	"github.com/stripe-inbox/inbox/internal/worker"
)

// Ops is the configuration of the operations function (functions/ops) and
// of inboxctl's local runs.
type Ops struct {
	Common
	// MaxAttempts is the worker's MAX_ATTEMPTS (the stack gives both the
	// same): receipts at it wait for review.
	MaxAttempts int
	// APIVersion is STRIPE_API_VERSION, the version the stage's handlers
	// are written for; optional (status then marks no version).
	APIVersion string
}

// LoadOps reads MAX_ATTEMPTS (default 10, as the worker), STRIPE_API_VERSION
// (optional) and the database settings. One request at a time: a pool of 2.
func LoadOps(env Env) (Ops, error) {
	var p problems
	o := Ops{Common: p.common(env, "ops", 2)}
	o.MaxAttempts = p.integer(env, "MAX_ATTEMPTS", worker.DefaultMaxAttempts, 1, 1000)
	o.APIVersion = p.apiVersion(env)
	return o, p.err()
}

// apiVersion reads STRIPE_API_VERSION: empty, or a Stripe API version.
func (p *problems) apiVersion(env Env) string {
	v := strings.TrimSpace(env("STRIPE_API_VERSION"))
	if v == "" {
		return ""
	}
	if err := stripeevent.CheckAPIVersion(v); err != nil {
		p.addf("STRIPE_API_VERSION: %v", err)
		return ""
	}
	return v
}
