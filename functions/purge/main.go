// Command purge is the Lambda that an EventBridge schedule invokes daily to
// delete processed receipts and published outbox rows past the retention
// (and, when configured, scrub old receipt payloads); see internal/retention.
// It returns the run's summary as JSON; the run logs it and emits its metrics.
package main

import (
	"context"
	"os"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambda"

	"github.com/stripe-inbox/inbox/internal/bootstrap"
	"github.com/stripe-inbox/inbox/internal/config"
	"github.com/stripe-inbox/inbox/internal/retention"
)

func main() {
	logger := bootstrap.Logger(os.Stdout)
	cfg, err := config.LoadPurge(os.Getenv)
	if err != nil {
		bootstrap.Fail(logger, "purge cannot start", err)
	}
	p, pool, err := bootstrap.NewPurger(context.Background(), cfg, logger, os.Stdout)
	if err != nil {
		bootstrap.Fail(logger, "purge cannot start", err)
	}
	handler := func(ctx context.Context, _ events.EventBridgeEvent) (retention.Summary, error) {
		return p.Run(ctx)
	}
	lambda.StartWithOptions(handler, lambda.WithEnableSIGTERM(pool.Close))
}
