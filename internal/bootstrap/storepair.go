package bootstrap

import (
	"context"
	"fmt"
	"io"

	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stripe-inbox/inbox/internal/config"
	"github.com/stripe-inbox/inbox/internal/database"
	"github.com/stripe-inbox/inbox/internal/invokeproof"
	"github.com/stripe-inbox/inbox/internal/metrics"
	"github.com/stripe-inbox/inbox/internal/secrets"
)

// stripeCaller is the wiring the reconciler and the write-back sender share
// (config.StripeCaller): how to fetch the Stripe API key, and, with
// STORE_FUNCTION, the Lambda client and the prover of their calls to the
// store function (internal/storecall).
type stripeCaller struct {
	// fetchKey fetches the key and checks it: a key, of STRIPE_MODE's mode,
	// and, from Secrets Manager, a restricted one.
	fetchKey func(context.Context) (string, error)
	// lambda and prover are set when the caller has a store function.
	lambda *lambda.Client
	prover *invokeproof.Signer
}

func newStripeCaller(ctx context.Context, c config.StripeCaller) (stripeCaller, error) {
	var sc stripeCaller
	fetch := secrets.Literal
	if c.APIKeyFromSecretsManager || c.StoreFunction != "" {
		cfg, err := awsConfig(ctx)
		if err != nil {
			return sc, err
		}
		if c.APIKeyFromSecretsManager {
			fetch = secrets.SecretsManager(secretsmanager.NewFromConfig(cfg))
		}
		if c.StoreFunction != "" {
			sc.lambda = lambda.NewFromConfig(cfg)
			// Each request to the store function carries a presigned
			// sts:GetCallerIdentity made with this function's role.
			sc.prover = invokeproof.NewSigner(cfg)
		}
	}
	sc.fetchKey = func(ctx context.Context) (string, error) {
		key, mode, err := secrets.FetchAPIKey(ctx, fetch, c.APIKeyRef, c.SecretFetchTimeout)
		if err != nil {
			return "", err
		}
		if c.APIKeyFromSecretsManager {
			// In AWS only a restricted key: the function needs its one
			// permission (Events: Read; Customers: Write), nothing else.
			// (A local run may use any test key.)
			if err := secrets.CheckRestricted(key); err != nil {
				return "", fmt.Errorf("the Stripe API key's secret: %w", err)
			}
		}
		if c.Mode != "" && mode != c.Mode {
			return "", fmt.Errorf("the Stripe API key is a %s-mode key but STRIPE_MODE=%s: store a key of the mode this deployment books", mode, c.Mode)
		}
		return key, nil
	}
	return sc, nil
}

// callerMetrics is the caller's metrics emitter.
func callerMetrics(out io.Writer, c config.StripeCaller) *metrics.Emitter {
	em := metrics.New(out, c.MetricsNamespace, c.MetricsDimensions)
	if c.MetricsPublish != nil {
		em.Publish(c.MetricsPublish)
	}
	return em
}

// newStore is what a store function inside the VPC needs: a verifier that
// admits only the caller's role (roleARN), with the STS endpoint this
// environment's SDK resolves (the STS VPC endpoint's private DNS name in
// the stack; AWS_ENDPOINT_URL_STS for a stand-in), and its pool.
func newStore(ctx context.Context, roleARN string, db database.Config) (*invokeproof.Verifier, *pgxpool.Pool, error) {
	admit, err := invokeproof.Role(roleARN)
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
	pool, err := Pool(ctx, db)
	if err != nil {
		return nil, nil, err
	}
	return verifier, pool, nil
}
