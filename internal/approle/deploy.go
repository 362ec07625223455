package approle

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stripe-inbox/inbox/internal/migrate"
)

// Summary is what the migrate function returns (and logs).
type Summary struct {
	Applied []string `json:"applied"`
	Current string   `json:"current"`
	Roles   Result   `json:"roles"`
}

// Deployer is the deploy-time database step, run as the RDS master user:
// the roles (Prepare), then the migrations as the owner role, then each
// login role's privileges (Grant). Any failure is returned, so the CDK
// trigger that invokes it (and with it the deploy) fails before new code
// serves.
type Deployer struct {
	// Connect opens a dedicated connection as the master user
	// (bootstrap.NewDeployer: database.Connect).
	Connect func(ctx context.Context) (*pgx.Conn, error)
	// Passwords returns the login roles' passwords.
	Passwords func(ctx context.Context) (Passwords, error)
	Roles     Roles
	// ConnectWait bounds the retries of the first connection.
	ConnectWait time.Duration
	// RetryEvery is the pause between connection attempts (default 5s).
	RetryEvery time.Duration
	Logger     *slog.Logger

	// iamRole stands in for rds_iam in tests (default RDSIAMRole).
	iamRole string
}

// Run performs the step once.
func (d *Deployer) Run(ctx context.Context) (Summary, error) {
	var sum Summary
	pw, err := d.Passwords(ctx)
	if err != nil {
		return sum, fmt.Errorf("reading the database roles' passwords: %w", err)
	}
	conn, err := d.connect(ctx)
	if err != nil {
		return sum, err
	}
	defer conn.Close(context.WithoutCancel(ctx))

	iamRole := d.iamRole
	if iamRole == "" {
		iamRole = RDSIAMRole
	}
	roles, err := prepare(ctx, conn, d.Roles, pw, iamRole)
	sum.Roles = roles
	if err != nil {
		return sum, fmt.Errorf("preparing the database roles: %w", err)
	}
	d.Logger.Info("database roles prepared", "owner", roles.Owner, "owner_created", roles.OwnerCreated,
		"reowned", roles.Reowned, "users", roles.Users, "legacy", roles.Legacy, "retired", roles.Retired)

	// Migrations run as the owner, so the objects they create are its.
	owner := pgx.Identifier{d.Roles.Owner}.Sanitize()
	if _, err := conn.Exec(ctx, "SET ROLE "+owner); err != nil {
		return sum, fmt.Errorf("becoming the owner %s for the migrations: %w", d.Roles.Owner, err)
	}
	res, err := migrate.Up(ctx, conn)
	if err != nil {
		return sum, fmt.Errorf("migrating: %w", err)
	}
	sum.Applied, sum.Current = res.Applied, res.Current
	if sum.Applied == nil {
		sum.Applied = []string{}
	}
	if _, err := conn.Exec(ctx, "RESET ROLE"); err != nil {
		return sum, fmt.Errorf("leaving the owner role: %w", err)
	}
	d.Logger.Info("migrations applied", "applied", sum.Applied, "current", sum.Current, "as", d.Roles.Owner)

	if err := Grant(ctx, conn, d.Roles); err != nil {
		return sum, fmt.Errorf("granting the functions' privileges: %w", err)
	}
	d.Logger.Info("privileges granted", "webhook", d.Roles.Webhook, "worker", d.Roles.Worker, "purge", d.Roles.Purge)
	return sum, nil
}

// connect retries until the connection succeeds, ConnectWait has passed or
// ctx ends. On a stack's first deploy the proxy answers before its target
// is registered, and refuses connections until it is.
func (d *Deployer) connect(ctx context.Context) (*pgx.Conn, error) {
	every := d.RetryEvery
	if every <= 0 {
		every = 5 * time.Second
	}
	deadline := time.Now().Add(d.ConnectWait)
	for attempt := 1; ; attempt++ {
		conn, err := d.Connect(ctx)
		if err == nil {
			return conn, nil
		}
		if ctx.Err() != nil || time.Now().Add(every).After(deadline) {
			return nil, fmt.Errorf("connecting to the database (%d attempts): %w", attempt, err)
		}
		d.Logger.Warn("database not reachable yet; retrying", "attempt", attempt, "error", err.Error())
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("connecting to the database (%d attempts): %w", attempt, err)
		case <-time.After(every):
		}
	}
}
