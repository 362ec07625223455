// Command migrate is the Lambda that a CDK trigger invokes on every deploy,
// after the database and RDS Proxy are ready and before the webhook, worker
// and purge functions are updated. It connects through the proxy as the
// schema owner (IAM token), applies the pending migrations and keeps the
// application role in shape; see internal/approle. An error fails the
// trigger and with it the deploy.
package main

import (
	"context"
	"os"

	"github.com/aws/aws-lambda-go/lambda"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/jackc/pgx/v5"

	"github.com/stripe-inbox/inbox/internal/approle"
	"github.com/stripe-inbox/inbox/internal/bootstrap"
	"github.com/stripe-inbox/inbox/internal/secrets"
)

func main() {
	logger := bootstrap.Logger(os.Stdout)
	cfg, err := approle.LoadConfig(os.Getenv)
	if err != nil {
		bootstrap.Fail(logger, "migrate cannot start", err)
	}
	d := &approle.Deployer{
		AppUser:     cfg.AppUser,
		ConnectWait: cfg.ConnectWait,
		Logger:      logger,
		AppPassword: func(context.Context) (string, error) { return cfg.AppPassword, nil },
		Connect: func(ctx context.Context) (*pgx.Conn, error) {
			return approle.Connect(ctx, cfg.Database, nil)
		},
	}
	if cfg.Database.ProxyHost != "" || cfg.AppSecretARN != "" {
		aws, err := awsconfig.LoadDefaultConfig(context.Background())
		if err != nil {
			bootstrap.Fail(logger, "migrate cannot start", err)
		}
		d.Connect = func(ctx context.Context) (*pgx.Conn, error) {
			return approle.Connect(ctx, cfg.Database, aws.Credentials)
		}
		if cfg.AppSecretARN != "" {
			fetch := secrets.SecretsManager(secretsmanager.NewFromConfig(aws))
			d.AppPassword = func(ctx context.Context) (string, error) {
				text, err := fetch(ctx, cfg.AppSecretARN)
				if err != nil {
					return "", err
				}
				return approle.PasswordFromSecret(text, cfg.AppUser)
			}
		}
	}
	lambda.Start(d.Run)
}
