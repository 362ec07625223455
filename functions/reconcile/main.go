// Command reconcile is the Lambda, outside the VPC, that an EventBridge
// schedule invokes (default every 15 minutes) to list the handlers' event
// types on Stripe's Events API and hand each page to the store function
// inside the VPC (see internal/reconcile). Invoked with a window
// (cmd/reconcile --stage), it backfills that window instead. It returns the
// run's summary as JSON.
package main

import (
	"context"
	"os"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/stripe-inbox/inbox/internal/bootstrap"
	"github.com/stripe-inbox/inbox/internal/config"
	"github.com/stripe-inbox/inbox/internal/reconcile"
)

func main() {
	logger := bootstrap.Logger(os.Stdout)
	cfg, err := config.LoadReconcile(os.Getenv)
	if err != nil {
		bootstrap.Fail(logger, "reconcile cannot start", err)
	}
	r, err := bootstrap.NewReconciler(context.Background(), cfg, logger, os.Stdout)
	if err != nil {
		bootstrap.Fail(logger, "reconcile cannot start", err)
	}
	lambda.StartWithOptions(func(ctx context.Context, in reconcile.Invocation) (reconcile.Summary, error) {
		return r.Invoke(ctx, in)
	}, lambda.WithEnableSIGTERM(r.Close))
}
