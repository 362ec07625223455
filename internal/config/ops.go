package config

import (
	"strings"

	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/ops"
	"github.com/stripe-inbox/inbox/internal/outbox"
)

// Ops is the configuration of the operations function (functions/ops) and
// of inboxctl's local runs.
type Ops struct {
	Common
	Ops ops.Config
}

// LoadOps reads MAX_ATTEMPTS (default 10, as the worker's; the range is
// inbox.CheckMaxAttempts'), OUTBOX_MAX_ATTEMPTS (default 10, as the
// relay's; outbox.CheckMaxAttempts) and STRIPE_API_VERSION (optional), all checked
// by ops.Config.Validate, and the common settings. One request
// at a time: a pool of 2.
func LoadOps(env Env) (Ops, error) {
	var p problems
	o := Ops{Common: p.common(env, "ops", 2)}
	o.Ops.MaxAttempts = p.wholeNumber(env, "MAX_ATTEMPTS", inbox.DefaultMaxAttempts)
	o.Ops.APIVersion = strings.TrimSpace(env("STRIPE_API_VERSION"))
	// The relay's OUTBOX_MAX_ATTEMPTS, so that inboxctl's outbox rows
	// waiting for a human are the relay's (range: outbox.CheckMaxAttempts).
	o.Ops.OutboxMaxAttempts = p.wholeNumber(env, "OUTBOX_MAX_ATTEMPTS", outbox.DefaultMaxAttempts)
	if o.Ops.OutboxMaxAttempts == 0 {
		// ops.Config takes 0 for the default; a 0 set here is a mistake.
		p.addErr("", outbox.CheckMaxAttempts(0))
	}
	if err := o.Ops.Validate(); err != nil {
		p.addErr("", err)
	}
	return o, p.err()
}
