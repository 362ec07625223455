package bootstrap

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stripe-inbox/inbox/internal/config"
	"github.com/stripe-inbox/inbox/internal/invokeproof"
	"github.com/stripe-inbox/inbox/internal/ops"
)

// NewOps builds the operations function's handler: its Ops, and the
// verifier of its callers' identities, with the STS endpoint this
// environment's SDK resolves (the STS VPC endpoint's private DNS name in the
// stack; AWS_ENDPOINT_URL_STS for a stand-in).
func NewOps(ctx context.Context, c config.Ops, logger *slog.Logger) (*ops.Function, *pgxpool.Pool, error) {
	cfg, err := awsConfig(ctx)
	if err != nil {
		return nil, nil, err
	}
	endpoint, err := invokeproof.Endpoint(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	// Any principal STS verifies; Function admits those of its own account.
	verifier, err := invokeproof.NewVerifier(endpoint, invokeproof.Anyone, nil)
	if err != nil {
		return nil, nil, err
	}
	pool, err := Pool(ctx, c.Database)
	if err != nil {
		return nil, nil, err
	}
	o, err := ops.New(pool, c.Ops, logger)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return &ops.Function{Ops: o, Proofs: verifier, Logger: logger}, pool, nil
}
