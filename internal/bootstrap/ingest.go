package bootstrap

import (
	"context"
	"io"
	"log/slog"

	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stripe-inbox/inbox/internal/config"
	"github.com/stripe-inbox/inbox/internal/ingest"
	"github.com/stripe-inbox/inbox/internal/wake"
)

// NewIngest builds the EventBridge ingest function: the handler over the
// pool, and the drainer of its queue with the SDK's SQS client, which uses
// SQS's dual-stack endpoint (sqs.REGION.api.aws, reached over the VPC's
// IPv6 egress) as every client does (internal/dualstack: off when an
// AWS_ENDPOINT_URL* names a stand-in).
func NewIngest(ctx context.Context, c config.Ingest, logger *slog.Logger, out io.Writer) (*ingest.Drainer, *pgxpool.Pool, error) {
	cfg, err := awsConfig(ctx)
	if err != nil {
		return nil, nil, err
	}
	pool, err := Pool(ctx, c.Database)
	if err != nil {
		return nil, nil, err
	}
	em := Metrics(out, c.Common)
	h, err := ingest.New(pool, c.Sources, logger, em)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	if c.WakeFunction != "" {
		w, err := wake.NewLambda(lambda.NewFromConfig(cfg), c.WakeFunction, c.WakeTimeout)
		if err != nil {
			pool.Close()
			return nil, nil, err
		}
		h.WakeWith(w)
	}
	client := sqs.NewFromConfig(cfg)
	return &ingest.Drainer{
		Handler: h, SQS: client, QueueURL: c.QueueURL, DeadLetterURL: c.DeadLetterURL,
		Config: c.Drain, Logger: logger, Metrics: em,
	}, pool, nil
}
