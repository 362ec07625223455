// Command migrate is the Lambda that a CDK trigger invokes on every deploy,
// after the database and RDS Proxy are ready and before the webhook, worker
// and purge functions are updated. It connects through the proxy as the
// RDS master user (IAM token), keeps the database roles in shape, applies the
// pending migrations as the schema owner role and grants each function's
// role its privileges; see internal/approle. Its configuration is
// config.LoadMigrate's; it connects with internal/database. An error fails
// the trigger and with it the deploy.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/aws/aws-lambda-go/lambda"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/jackc/pgx/v5"

	"github.com/stripe-inbox/inbox/internal/approle"
	"github.com/stripe-inbox/inbox/internal/bootstrap"
	"github.com/stripe-inbox/inbox/internal/config"
	"github.com/stripe-inbox/inbox/internal/database"
	"github.com/stripe-inbox/inbox/internal/secrets"
)

func main() {
	logger := bootstrap.Logger(os.Stdout)
	cfg, err := config.LoadMigrate(os.Getenv)
	if err != nil {
		bootstrap.Fail(logger, "migrate cannot start", err)
	}
	d := &approle.Deployer{
		Roles:       cfg.Roles,
		ConnectWait: cfg.ConnectWait,
		Logger:      logger,
		Passwords:   func(context.Context) (approle.Passwords, error) { return cfg.Passwords, nil },
		Connect: func(ctx context.Context) (*pgx.Conn, error) {
			return database.Connect(ctx, cfg.Database, nil)
		},
	}
	if cfg.Database.ProxyHost != "" || len(cfg.SecretARNs) > 0 {
		aws, err := awsconfig.LoadDefaultConfig(context.Background())
		if err != nil {
			bootstrap.Fail(logger, "migrate cannot start", err)
		}
		d.Connect = func(ctx context.Context) (*pgx.Conn, error) {
			return database.Connect(ctx, cfg.Database, aws.Credentials)
		}
		if len(cfg.SecretARNs) > 0 {
			fetch := secrets.SecretsManager(secretsmanager.NewFromConfig(aws))
			d.Passwords = func(ctx context.Context) (approle.Passwords, error) {
				pw := cfg.Passwords
				for fn, user := range map[string]string{"webhook": cfg.Roles.Webhook, "worker": cfg.Roles.Worker, "purge": cfg.Roles.Purge, "ops": cfg.Roles.Ops, "legacy": cfg.Roles.Legacy, "reconcile": cfg.Roles.Reconcile} {
					arn, ok := cfg.SecretARNs[fn]
					if !ok || user == "" {
						continue
					}
					text, err := fetch(ctx, arn)
					if err != nil {
						return pw, fmt.Errorf("the %s's secret: %w", fn, err)
					}
					p, err := approle.PasswordFromSecret(text, user)
					if err != nil {
						return pw, err
					}
					switch fn {
					case "webhook":
						pw.Webhook = p
					case "worker":
						pw.Worker = p
					case "legacy":
						pw.Legacy = p
					case "ops":
						pw.Ops = p
					case "reconcile":
						pw.Reconcile = p
					default:
						pw.Purge = p
					}
				}
				return pw, nil
			}
		}
	}
	lambda.Start(d.Run)
}
