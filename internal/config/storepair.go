package config

import (
	"log/slog"
	"strings"
	"time"

	"github.com/stripe-inbox/inbox/internal/database"
	"github.com/stripe-inbox/inbox/internal/invokeproof"
	"github.com/stripe-inbox/inbox/internal/secrets"
)

// StripeCaller is what the reconciler (Reconcile) and the write-back sender
// (Writeback) share: each is a function outside the VPC that calls Stripe
// with an API key and hands its database operations to a store function
// inside the VPC (STORE_FUNCTION), or, locally, stores through DATABASE_URL
// (docs/design.md, "A caller outside the VPC, a store inside").
type StripeCaller struct {
	MetricsNamespace  string
	MetricsDimensions map[string]string
	// MetricsPublish: see Common.MetricsPublish (METRICS_PUBLISH).
	MetricsPublish []string
	// Database is set when StoreFunction is not: the caller stores
	// directly.
	Database database.Config
	// StoreFunction is the store function's name or ARN (AWS).
	StoreFunction string
	// APIKeyRef is the Stripe API key: a Secrets Manager ARN
	// (APIKeyFromSecretsManager) or the key itself (local).
	APIKeyRef                string
	APIKeyFromSecretsManager bool
	SecretFetchTimeout       time.Duration
	// Mode is STRIPE_MODE when set: the key's mode must match it.
	Mode     string
	LogLevel slog.Level // LOG_LEVEL
}

// stripeCaller reads the metrics settings (service's), LOG_LEVEL and the
// key: STRIPE_API_KEY_SECRET_ARN (AWS: a Secrets Manager secret holding a
// restricted key) or STRIPE_API_KEY (local), exactly one;
// SECRET_FETCH_TIMEOUT (2s); STRIPE_MODE (optional: live or test), which
// the key's mode must match. awsKey says, in the message for a missing
// key, what the AWS key needs ("" or e.g. "; a restricted key with
// Customers: Write").
func (p *problems) stripeCaller(env Env, service, awsKey string) StripeCaller {
	var c StripeCaller
	c.MetricsNamespace, c.MetricsDimensions = p.metricsSettings(env, service)
	c.MetricsPublish = p.metricsPublish(env)
	c.LogLevel = p.logLevel(env)

	arn, literal := strings.TrimSpace(env("STRIPE_API_KEY_SECRET_ARN")), strings.TrimSpace(env("STRIPE_API_KEY"))
	switch {
	case arn != "" && literal != "":
		p.addf("set either STRIPE_API_KEY_SECRET_ARN (AWS) or STRIPE_API_KEY (local), not both")
	case arn != "":
		if !strings.HasPrefix(arn, "arn:") || !strings.Contains(arn, ":secretsmanager:") {
			p.addf("STRIPE_API_KEY_SECRET_ARN=%q: not a Secrets Manager ARN", arn)
		}
		c.APIKeyRef, c.APIKeyFromSecretsManager = arn, true
	case literal != "":
		if _, err := secrets.APIKeyMode(literal); err != nil {
			p.addf("STRIPE_API_KEY: %v", err)
		}
		c.APIKeyRef = literal
	default:
		p.addf("no Stripe API key: set STRIPE_API_KEY=rk_test_... (local) or STRIPE_API_KEY_SECRET_ARN=arn:aws:secretsmanager:... (AWS%s)", awsKey)
	}
	c.SecretFetchTimeout = p.durationIn(env, "SECRET_FETCH_TIMEOUT", secrets.DefaultFetchTimeout, 100*time.Millisecond, 30*time.Second)
	switch c.Mode = strings.TrimSpace(env("STRIPE_MODE")); c.Mode {
	case "", "live", "test":
	default:
		p.addf("STRIPE_MODE=%q: must be live or test", c.Mode)
	}
	if literal != "" && c.Mode != "" {
		if m, err := secrets.APIKeyMode(literal); err == nil && m != c.Mode {
			p.addf("STRIPE_API_KEY is a %s-mode key but STRIPE_MODE=%s: use a key of the mode this deployment books", m, c.Mode)
		}
	}
	return c
}

// storeOrDatabase reads where the caller stores: STORE_FUNCTION (AWS: the
// store function, called store in messages) or DATABASE_URL (local, as
// application appName), exactly one; nowhere is the message's start when
// neither is set.
func (p *problems) storeOrDatabase(env Env, c *StripeCaller, store, nowhere, appName string) {
	c.StoreFunction = strings.TrimSpace(env("STORE_FUNCTION"))
	dbURL := strings.TrimSpace(env("DATABASE_URL"))
	switch {
	case c.StoreFunction != "" && dbURL != "":
		p.addf("set either STORE_FUNCTION (AWS: %s inside the VPC) or DATABASE_URL (local), not both", store)
	case c.StoreFunction == "" && dbURL == "":
		p.addf("%s: set STORE_FUNCTION (AWS) or DATABASE_URL (local)", nowhere)
	case dbURL != "":
		c.Database = database.Config{URL: dbURL, AppName: appName, MaxConns: 2}
		if err := c.Database.Validate(); err != nil {
			p.addf("database: %v", err)
		}
	}
}

// callerRole reads name (required), the role of the caller whose proofs the
// store function admits (invokeproof.Role): store serves only requests
// proven to come from caller.
func (p *problems) callerRole(env Env, name, store, caller string) string {
	arn := strings.TrimSpace(env(name))
	if arn == "" {
		p.addf("%s is not set: %s serves only requests proven to come from %s (arn:aws:iam::ACCOUNT:role/NAME; the stack sets it)", name, store, caller)
	} else if _, err := invokeproof.Role(arn); err != nil {
		p.addf("%s: %v", name, err)
	}
	return arn
}
