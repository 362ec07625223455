package bootstrap

import (
	"context"
	"io"
	"log/slog"
	"os"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stripe-inbox/inbox/internal/config"
	"github.com/stripe-inbox/inbox/internal/ingest"
)

// NewIngest builds the EventBridge ingest function: the handler over the
// pool, and the drainer of its queue with the SDK's SQS client. The client
// uses SQS's dual-stack endpoint (sqs.REGION.api.aws, reached over IPv6
// egress) unless an endpoint is configured (AWS_ENDPOINT_URL_SQS or
// AWS_ENDPOINT_URL: a stand-in, or an interface endpoint's DNS name), which
// the SDK's endpoint rules do not combine with dual-stack
// (https://docs.aws.amazon.com/sdkref/latest/guide/feature-endpoints.html).
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
	client := sqs.NewFromConfig(cfg, func(o *sqs.Options) {
		if DualStack(cfg) {
			o.EndpointOptions.UseDualStackEndpoint = aws.DualStackEndpointStateEnabled
		}
	})
	return &ingest.Drainer{
		Handler: h, SQS: client, QueueURL: c.QueueURL, DeadLetterURL: c.DeadLetterURL,
		Config: c.Drain, Logger: logger, Metrics: em,
	}, pool, nil
}

// DualStack reports whether the SQS client may use the dual-stack endpoint:
// when no custom endpoint is configured.
func DualStack(cfg aws.Config) bool {
	return cfg.BaseEndpoint == nil && os.Getenv("AWS_ENDPOINT_URL_SQS") == "" && os.Getenv("AWS_ENDPOINT_URL") == ""
}
