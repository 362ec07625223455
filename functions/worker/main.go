// Command worker is the Lambda that an EventBridge schedule invokes every
// minute to drain the inbox (see internal/worker) and, when OUTBOX_BUS is
// set, to relay the outbox to EventBridge (internal/outbox). It returns the run's
// summary as JSON.
package main

import (
	"context"
	"errors"
	"os"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambda"

	"github.com/stripe-inbox/inbox/internal/bootstrap"
	"github.com/stripe-inbox/inbox/internal/config"
	"github.com/stripe-inbox/inbox/internal/worker"
)

func main() {
	logger := bootstrap.Logger(os.Stdout)
	cfg, err := config.LoadWorker(os.Getenv)
	ocfg, oerr := config.LoadOutbox(os.Getenv)
	if err := errors.Join(err, oerr); err != nil {
		bootstrap.Fail(logger, "worker cannot start", err)
	}
	w, pool, err := bootstrap.NewWorker(context.Background(), cfg, logger, os.Stdout)
	if err != nil {
		bootstrap.Fail(logger, "worker cannot start", err)
	}
	// The outbox relay runs inside the worker when OUTBOX_BUS is set.
	if err := bootstrap.AttachRelay(context.Background(), w, pool, cfg, ocfg, logger, os.Stdout); err != nil {
		bootstrap.Fail(logger, "worker cannot start", err)
	}
	handler := func(ctx context.Context, _ events.EventBridgeEvent) (worker.Summary, error) {
		s, err := w.Run(ctx)
		logger.InfoContext(ctx, "worker run", "summary", s)
		return s, err
	}
	lambda.StartWithOptions(handler, lambda.WithEnableSIGTERM(pool.Close))
}
