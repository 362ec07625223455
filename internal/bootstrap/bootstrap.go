// Package bootstrap builds each function's long-lived dependencies (logger,
// AWS clients, database pool, signing-secret keyring, handler) from its
// validated configuration. functions/*/main.go and cmd/local call it, so the
// Lambda binaries and the local runner are wired the same way.
package bootstrap

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stripe-inbox/inbox/internal/config"
	"github.com/stripe-inbox/inbox/internal/database"
	"github.com/stripe-inbox/inbox/internal/dualstack"
	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/metrics"
	"github.com/stripe-inbox/inbox/internal/outbox"
	"github.com/stripe-inbox/inbox/internal/retention"
	"github.com/stripe-inbox/inbox/internal/secrets"
	"github.com/stripe-inbox/inbox/internal/wake"
	"github.com/stripe-inbox/inbox/internal/webhook"
	"github.com/stripe-inbox/inbox/internal/worker"
)

// Logger returns the JSON logger every function uses, at LOG_LEVEL (debug,
// info, warn, error; default info). It is built before the configuration is
// loaded, so that a configuration error can be logged: an invalid LOG_LEVEL
// logs at info here, and the function's loader refuses it (config.LogLevel).
func Logger(w io.Writer) *slog.Logger {
	level, _ := config.LogLevel(os.Getenv)
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
}

// Fail logs err as the reason the function cannot start and exits non-zero,
// which makes a Lambda init fail with that message in its log.
func Fail(logger *slog.Logger, what string, err error) {
	logger.Error(what, "error", err.Error())
	fmt.Fprintf(os.Stderr, "%s: %v\n", what, err)
	os.Exit(1)
}

// awsConfig loads the SDK's default configuration (region and credentials
// from the Lambda environment; AWS_ENDPOINT_URL_SECRETS_MANAGER and the like
// are honoured) with the dual-stack endpoints on: the functions in the VPC
// reach AWS over IPv6 only (internal/dualstack).
func awsConfig(ctx context.Context) (aws.Config, error) {
	return dualstack.Load(ctx)
}

// Pool opens the database pool for c, loading AWS credentials only when the
// pool authenticates to RDS Proxy with IAM.
func Pool(ctx context.Context, c database.Config) (*pgxpool.Pool, error) {
	var creds aws.CredentialsProvider
	if c.ProxyHost != "" {
		cfg, err := awsConfig(ctx)
		if err != nil {
			return nil, err
		}
		creds = cfg.Credentials
	}
	return database.Open(ctx, c, creds)
}

// Metrics returns the EMF emitter for c.
func Metrics(w io.Writer, c config.Common) *metrics.Emitter {
	em := metrics.New(w, c.MetricsNamespace, c.MetricsDimensions)
	if c.MetricsPublish != nil {
		em.Publish(c.MetricsPublish)
	}
	return em
}

// Webhook is the webhook function's wiring.
type Webhook struct {
	Handler *webhook.Handler
	Pool    *pgxpool.Pool
	Keyring *secrets.Keyring
}

// NewWebhook fetches every endpoint's signing secret (failing when one is
// missing or malformed) and builds the handler.
func NewWebhook(ctx context.Context, c config.Webhook, logger *slog.Logger, out io.Writer) (*Webhook, error) {
	fetch := secrets.Literal
	if c.FromSecretsManager {
		cfg, err := awsConfig(ctx)
		if err != nil {
			return nil, err
		}
		fetch = secrets.SecretsManager(secretsmanager.NewFromConfig(cfg))
	}
	em := Metrics(out, c.Common)
	keyring, err := secrets.NewKeyring(ctx, c.Endpoints, fetch, secrets.Options{
		TTL: c.SecretTTL, FetchTimeout: c.SecretFetchTimeout, Logger: logger, Metrics: em,
	})
	if err != nil {
		return nil, err
	}
	pool, err := Pool(ctx, c.Database)
	if err != nil {
		return nil, err
	}
	h, err := webhook.New(pool, keyring, c.Handler, logger, em)
	if err != nil {
		pool.Close()
		return nil, err
	}
	if c.WakeFunction != "" {
		cfg, err := awsConfig(ctx)
		if err != nil {
			pool.Close()
			return nil, err
		}
		w, err := wake.NewLambda(lambda.NewFromConfig(cfg), c.WakeFunction, c.WakeTimeout)
		if err != nil {
			pool.Close()
			return nil, err
		}
		h.WakeWith(w)
	}
	return &Webhook{Handler: h, Pool: pool, Keyring: keyring}, nil
}

// NewWorker builds the worker, and sets the process's garbage collector to
// the worker's settings (config.GC).
func NewWorker(ctx context.Context, c config.Worker, logger *slog.Logger, out io.Writer) (*worker.Worker, *pgxpool.Pool, error) {
	if c.GC.Percent > 0 {
		debug.SetGCPercent(c.GC.Percent)
	}
	if c.GC.MemoryLimit > 0 {
		debug.SetMemoryLimit(c.GC.MemoryLimit)
	}
	pool, err := Pool(ctx, c.Database)
	if err != nil {
		return nil, nil, err
	}
	w, err := worker.New(pool, handlers.New(c.Handlers), c.Worker, logger, Metrics(out, c.Common))
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return w, pool, nil
}

// NewPurger builds the purge.
func NewPurger(ctx context.Context, c config.Purge, logger *slog.Logger, out io.Writer) (*retention.Purger, *pgxpool.Pool, error) {
	pool, err := Pool(ctx, c.Database)
	if err != nil {
		return nil, nil, err
	}
	p, err := retention.New(pool, c.Purge, logger, Metrics(out, c.Common))
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return p, pool, nil
}

// AttachRelay attaches the outbox relay to w when c turns it on (OUTBOX_BUS
// set): an EventBridge client from the SDK's usual configuration (region
// and credentials from the environment; AWS_ENDPOINT_URL_EVENTBRIDGE points
// it at a stand-in), on w's pool, writing its metrics with the worker's.
func AttachRelay(ctx context.Context, w *worker.Worker, pool *pgxpool.Pool, wc config.Worker, c config.Outbox, logger *slog.Logger, out io.Writer) error {
	if !c.Enabled {
		return nil
	}
	cfg, err := awsConfig(ctx)
	if err != nil {
		return err
	}
	r, err := outbox.New(pool, eventbridge.NewFromConfig(cfg), c.Relay, logger, Metrics(out, wc.Common))
	if err != nil {
		return err
	}
	w.SetRelay(r, r.Config().Every)
	return nil
}
