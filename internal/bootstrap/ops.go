package bootstrap

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stripe-inbox/inbox/internal/config"
	"github.com/stripe-inbox/inbox/internal/ops"
)

// NewOps builds the operations function's Ops.
func NewOps(ctx context.Context, c config.Ops, logger *slog.Logger) (*ops.Ops, *pgxpool.Pool, error) {
	pool, err := Pool(ctx, c.Database)
	if err != nil {
		return nil, nil, err
	}
	o, err := ops.New(pool, c.Ops, logger)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return o, pool, nil
}
