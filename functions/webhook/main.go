// Command webhook is the Lambda behind the Function URL that Stripe delivers
// to. It verifies each delivery and commits its receipt to the inbox; see
// internal/webhook.
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
	cfg, err := config.LoadWebhook(os.Getenv)
	if err != nil {
		bootstrap.Fail(logger, "webhook cannot start", err)
	}
	app, err := bootstrap.NewWebhook(context.Background(), cfg, logger, os.Stdout)
	if err != nil {
		bootstrap.Fail(logger, "webhook cannot start", err)
	}
	logger.Info("webhook ready", "endpoints", app.Keyring.Endpoints())
	lambda.StartWithOptions(app.Handler.Handle, lambda.WithEnableSIGTERM(app.Pool.Close))
}
