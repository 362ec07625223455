package bootstrap

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/jackc/pgx/v5"

	"github.com/stripe-inbox/inbox/internal/approle"
	"github.com/stripe-inbox/inbox/internal/config"
	"github.com/stripe-inbox/inbox/internal/database"
	"github.com/stripe-inbox/inbox/internal/secrets"
)

// NewDeployer builds the migrate function's deploy step: it connects as the
// master user (through RDS Proxy with an IAM token when ProxyHost is set),
// and reads each login role's password from its Secrets Manager secret when
// SecretARNs names one (otherwise from the configuration: local runs and
// tests).
func NewDeployer(ctx context.Context, cfg config.Migrate, logger *slog.Logger) (*approle.Deployer, error) {
	d := &approle.Deployer{
		Roles:       cfg.Roles,
		ConnectWait: cfg.ConnectWait,
		Logger:      logger,
		Passwords:   func(context.Context) (approle.Passwords, error) { return cfg.Passwords, nil },
		Connect: func(ctx context.Context) (*pgx.Conn, error) {
			return database.Connect(ctx, cfg.Database, nil)
		},
	}
	if cfg.Database.ProxyHost == "" && len(cfg.SecretARNs) == 0 {
		return d, nil
	}
	aws, err := awsConfig(ctx)
	if err != nil {
		return nil, err
	}
	d.Connect = func(ctx context.Context) (*pgx.Conn, error) {
		return database.Connect(ctx, cfg.Database, aws.Credentials)
	}
	if len(cfg.SecretARNs) > 0 {
		fetch := secrets.SecretsManager(secretsmanager.NewFromConfig(aws))
		d.Passwords = func(ctx context.Context) (approle.Passwords, error) {
			pw := cfg.Passwords
			for fn, user := range map[string]string{"webhook": cfg.Roles.Webhook, "worker": cfg.Roles.Worker, "purge": cfg.Roles.Purge, "ops": cfg.Roles.Ops, "legacy": cfg.Roles.Legacy, "reconcile": cfg.Roles.Reconcile, "ingest": cfg.Roles.Ingest, "writeback": cfg.Roles.Writeback} {
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
				case "ingest":
					pw.Ingest = p
				case "writeback":
					pw.Writeback = p
				default:
					pw.Purge = p
				}
			}
			return pw, nil
		}
	}
	return d, nil
}
