// Command migrate is the Lambda that a CDK trigger invokes on every deploy,
// after the database and RDS Proxy are ready and before the webhook, worker
// and purge functions are updated. It connects through the proxy as the
// RDS master user (IAM token), keeps the database roles in shape, applies the
// pending migrations as the schema owner role and grants each function's
// role its privileges; see internal/approle. Its configuration is
// config.LoadMigrate's; bootstrap.NewDeployer wires it. An error fails the
// trigger and with it the deploy.
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
	cfg, err := config.LoadMigrate(os.Getenv)
	if err != nil {
		bootstrap.Fail(logger, "migrate cannot start", err)
	}
	d, err := bootstrap.NewDeployer(context.Background(), cfg, logger)
	if err != nil {
		bootstrap.Fail(logger, "migrate cannot start", err)
	}
	lambda.Start(d.Run)
}
