// Command writeback is the Lambda, outside the VPC, that an EventBridge
// schedule invokes every minute to send the due write-backs to Stripe
// exactly once (internal/writeback, docs/writebacks.md): it claims intents
// through the writebackstore function inside the VPC (STORE_FUNCTION, each
// request proven with this function's role), calls Stripe with the
// restricted key from Secrets Manager (STRIPE_API_KEY_SECRET_ARN), records
// each outcome, and emits the backlog's gauges. It returns the run's
// summary as JSON.
package main

import (
	"context"
	"os"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/stripe-inbox/inbox/internal/bootstrap"
	"github.com/stripe-inbox/inbox/internal/config"
)

func main() {
	logger := bootstrap.Logger(os.Stdout)
	cfg, err := config.LoadWriteback(os.Getenv)
	if err != nil {
		bootstrap.Fail(logger, "writeback cannot start", err)
	}
	w, err := bootstrap.NewWriteback(context.Background(), cfg, logger, os.Stdout)
	if err != nil {
		bootstrap.Fail(logger, "writeback cannot start", err)
	}
	lambda.StartWithOptions(w.Invoke, lambda.WithEnableSIGTERM(w.Close))
}
