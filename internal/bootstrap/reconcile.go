package bootstrap

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stripe-inbox/inbox/internal/config"
	"github.com/stripe-inbox/inbox/internal/invokeproof"
	"github.com/stripe-inbox/inbox/internal/metrics"
	"github.com/stripe-inbox/inbox/internal/reconcile"
	"github.com/stripe-inbox/inbox/internal/secrets"
)

// Reconciler is the reconciler's wiring.
type Reconciler struct {
	*reconcile.Reconciler
	// Pool is set when it stores directly (local, backfill); close it.
	Pool *pgxpool.Pool
}

// Close releases the pool, if any.
func (r *Reconciler) Close() {
	if r.Pool != nil {
		r.Pool.Close()
	}
}

// NewReconciler fetches the Stripe API key (failing when it is missing, not
// a key, or of the other mode than STRIPE_MODE; and again, once, when Stripe
// answers 401: ClientConfig.RefetchKey) and builds the reconciler:
// pages go to the store function (STORE_FUNCTION, a Lambda Invoke) or to the
// database (DATABASE_URL).
func NewReconciler(ctx context.Context, c config.Reconcile, logger *slog.Logger, out io.Writer) (*Reconciler, error) {
	fetch := secrets.Literal
	var lc *lambda.Client
	var prover *invokeproof.Signer
	if c.APIKeyFromSecretsManager || c.StoreFunction != "" {
		cfg, err := awsConfig(ctx)
		if err != nil {
			return nil, err
		}
		if c.APIKeyFromSecretsManager {
			fetch = secrets.SecretsManager(secretsmanager.NewFromConfig(cfg))
		}
		if c.StoreFunction != "" {
			lc = lambda.NewFromConfig(cfg)
			// Each request to the store function carries a presigned
			// sts:GetCallerIdentity made with this function's role.
			prover = invokeproof.NewSigner(cfg)
		}
	}
	fetchKey := func(ctx context.Context) (string, error) {
		key, mode, err := secrets.FetchAPIKey(ctx, fetch, c.APIKeyRef, c.SecretFetchTimeout)
		if err != nil {
			return "", err
		}
		if c.APIKeyFromSecretsManager {
			// In AWS only a restricted key: the function needs Events: Read,
			// nothing else. (A local run may use any test key.)
			if err := secrets.CheckRestricted(key); err != nil {
				return "", fmt.Errorf("the Stripe API key's secret: %w", err)
			}
		}
		if c.Mode != "" && mode != c.Mode {
			return "", fmt.Errorf("the Stripe API key is a %s-mode key but STRIPE_MODE=%s: store a key of the mode this deployment books", mode, c.Mode)
		}
		return key, nil
	}
	key, err := fetchKey(ctx)
	if err != nil {
		return nil, err
	}
	cc := c.Client
	cc.Key = key
	cc.RefetchKey = fetchKey // once after a 401: a rolled key works without a cold start
	cc.Logger = logger
	client, err := reconcile.NewClient(cc)
	if err != nil {
		return nil, err
	}
	r := &Reconciler{}
	var sink reconcile.Sink
	if lc != nil {
		sink = reconcile.RemoteSink{Lambda: lc, Function: c.StoreFunction, Prover: prover}
	} else {
		if r.Pool, err = Pool(ctx, c.Database); err != nil {
			return nil, err
		}
		sink = reconcile.DBSink{DB: r.Pool}
	}
	em := metrics.New(out, c.MetricsNamespace, c.MetricsDimensions)
	if c.MetricsPublish != nil {
		em.Publish(c.MetricsPublish)
	}
	if r.Reconciler, err = reconcile.New(sink, client, c.Reconcile, logger, em); err != nil {
		if r.Pool != nil {
			r.Pool.Close()
		}
		return nil, err
	}
	return r, nil
}

// NewReconcileStore builds the store function's handler: it serves only
// requests proven to come from the reconciler's role, verified with the STS
// endpoint this environment's SDK resolves (the STS VPC endpoint's private
// DNS name in the stack; AWS_ENDPOINT_URL_STS for a stand-in).
func NewReconcileStore(ctx context.Context, c config.ReconcileStore, logger *slog.Logger, out io.Writer) (*reconcile.ProvenStore, *pgxpool.Pool, error) {
	admit, err := invokeproof.Role(c.ReconcilerRoleARN)
	if err != nil {
		return nil, nil, err
	}
	cfg, err := awsConfig(ctx)
	if err != nil {
		return nil, nil, err
	}
	endpoint, err := invokeproof.Endpoint(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	verifier, err := invokeproof.NewVerifier(endpoint, admit, nil)
	if err != nil {
		return nil, nil, err
	}
	pool, err := Pool(ctx, c.Database)
	if err != nil {
		return nil, nil, err
	}
	return &reconcile.ProvenStore{
		Store:   reconcile.StoreHandler{Sink: reconcile.DBSink{DB: pool}, Endpoints: c.Endpoints},
		Proofs:  verifier,
		Metrics: Metrics(out, c.Common),
		Logger:  logger,
	}, pool, nil
}
