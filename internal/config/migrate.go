package config

import (
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/stripe-inbox/inbox/internal/approle"
	"github.com/stripe-inbox/inbox/internal/database"
)

// Migrate is the migrate function's configuration.
type Migrate struct {
	// Database reaches PostgreSQL as the RDS master user (DB_USER; the
	// stack's is named inbox_owner for historical reasons), which creates
	// the roles and SET ROLEs to the owner for migrations. One connection.
	Database database.Config
	// Roles are the role names: SCHEMA_OWNER_ROLE, WEBHOOK_DB_USER,
	// WORKER_DB_USER, PURGE_DB_USER, LEGACY_DB_USER (optional: the earlier
	// release's shared role, kept working if it exists, e.g. inbox_app) and
	// RETIRED_DB_USERS (optional, comma-separated: roles of earlier
	// releases to strip, e.g. inbox_app in a later deploy).
	Roles approle.Roles
	// SecretARNs are the login roles' Secrets Manager secrets, JSON
	// {"username": ..., "password": ...}, keyed by function, or "legacy"
	// (WEBHOOK_DB_SECRET_ARN, WORKER_DB_SECRET_ARN, PURGE_DB_SECRET_ARN,
	// LEGACY_DB_SECRET_ARN; AWS). RDS Proxy logs in with the same secrets.
	SecretARNs map[string]string
	// Passwords are the passwords given directly (WEBHOOK_DB_PASSWORD,
	// WORKER_DB_PASSWORD, PURGE_DB_PASSWORD, LEGACY_DB_PASSWORD; local
	// runs only).
	Passwords approle.Passwords
	// ConnectWait is how long to keep retrying the first connection
	// (CONNECT_WAIT, default 4m, at most 14m: the function's timeout is 15m):
	// on a stack's first deploy the proxy's target can take minutes to
	// become available.
	ConnectWait time.Duration
	// LogLevel is LOG_LEVEL.
	LogLevel slog.Level
}

// migrateFunctions are the functions with a login role of their own, in the
// order of the variables' prefixes (WEBHOOK_, WORKER_, PURGE_).
var migrateFunctions = []string{"webhook", "worker", "purge"}

// LoadMigrate reads the migrate function's configuration and reports every
// mistake at once.
func LoadMigrate(env Env) (Migrate, error) {
	var p problems
	get := func(k string) string { return strings.TrimSpace(env(k)) }

	c := Migrate{
		Database: p.database(env, "migrate", 1),
		Roles: approle.Roles{
			Owner:   get("SCHEMA_OWNER_ROLE"),
			Webhook: get("WEBHOOK_DB_USER"),
			Worker:  get("WORKER_DB_USER"),
			Purge:   get("PURGE_DB_USER"),
			Legacy:  get("LEGACY_DB_USER"),
			Ops:     get("OPS_DB_USER"),
			// Optional: the reconciler's store function's role.
			Reconcile: get("RECONCILE_DB_USER"),
			// Optional: the EventBridge ingest function's role.
			Ingest: get("INGEST_DB_USER"),
			// Optional: the write-back store function's role.
			Writeback: get("WRITEBACK_DB_USER"),
		},
		SecretARNs: map[string]string{},
		LogLevel:   p.logLevel(env),
	}
	for _, k := range []string{"APP_DB_USER", "APP_DB_SECRET_ARN", "APP_DB_PASSWORD"} {
		if get(k) != "" {
			p.addf("%s is no longer read: each function has a role of its own (WEBHOOK_DB_USER, WORKER_DB_USER, PURGE_DB_USER, each with its _DB_SECRET_ARN or _DB_PASSWORD); name the old role in LEGACY_DB_USER (kept working while the new functions replace the old ones) or, in a later deploy, RETIRED_DB_USERS", k)
		}
	}
	if raw := get("RETIRED_DB_USERS"); raw != "" {
		for _, name := range strings.Split(raw, ",") {
			c.Roles.Retired = append(c.Roles.Retired, strings.TrimSpace(name))
		}
	}
	for what, name := range map[string]string{"SCHEMA_OWNER_ROLE": c.Roles.Owner, "WEBHOOK_DB_USER": c.Roles.Webhook, "WORKER_DB_USER": c.Roles.Worker, "PURGE_DB_USER": c.Roles.Purge} {
		if name == "" {
			p.addf("%s is not set: name the role, e.g. %s", what, map[string]string{
				"SCHEMA_OWNER_ROLE": "inbox_schema_owner", "WEBHOOK_DB_USER": "inbox_webhook", "WORKER_DB_USER": "inbox_worker", "PURGE_DB_USER": "inbox_purge",
			}[what])
		}
	}
	if c.Roles.Owner != "" && c.Roles.Webhook != "" && c.Roles.Worker != "" && c.Roles.Purge != "" {
		// DB_USER may be empty locally (DATABASE_URL carries the user).
		if err := c.Roles.Validate(c.Database.User); err != nil {
			p.addf("roles: %v", err)
		}
	}
	withSecret := migrateFunctions
	if c.Roles.Ops != "" {
		withSecret = append(slices.Clip(withSecret), "ops")
	} else {
		for _, k := range []string{"OPS_DB_SECRET_ARN", "OPS_DB_PASSWORD"} {
			if get(k) != "" {
				p.addf("%s is set but OPS_DB_USER is not: name the ops function's role (e.g. inbox_ops), or unset it", k)
			}
		}
	}
	if c.Roles.Reconcile != "" {
		withSecret = append(slices.Clip(withSecret), "reconcile")
	} else {
		for _, k := range []string{"RECONCILE_DB_SECRET_ARN", "RECONCILE_DB_PASSWORD"} {
			if get(k) != "" {
				p.addf("%s is set but RECONCILE_DB_USER is not: name the role the secret is for (inbox_reconcile), or unset it", k)
			}
		}
	}
	if c.Roles.Ingest != "" {
		withSecret = append(slices.Clip(withSecret), "ingest")
	} else {
		for _, k := range []string{"INGEST_DB_SECRET_ARN", "INGEST_DB_PASSWORD"} {
			if get(k) != "" {
				p.addf("%s is set but INGEST_DB_USER is not: name the role the secret is for (inbox_ingest), or unset it", k)
			}
		}
	}
	if c.Roles.Writeback != "" {
		withSecret = append(slices.Clip(withSecret), "writeback")
	} else {
		for _, k := range []string{"WRITEBACK_DB_SECRET_ARN", "WRITEBACK_DB_PASSWORD"} {
			if get(k) != "" {
				p.addf("%s is set but WRITEBACK_DB_USER is not: name the role the secret is for (inbox_writeback), or unset it", k)
			}
		}
	}
	if c.Roles.Legacy != "" {
		withSecret = append(slices.Clip(withSecret), "legacy")
		if slices.Contains(c.Roles.Retired, c.Roles.Legacy) {
			p.addf("LEGACY_DB_USER=%s is also in RETIRED_DB_USERS: keep it (LEGACY_DB_USER, while a rollback to the release that used it may happen) or retire it (RETIRED_DB_USERS), not both", c.Roles.Legacy)
		}
	} else {
		for _, k := range []string{"LEGACY_DB_SECRET_ARN", "LEGACY_DB_PASSWORD"} {
			if get(k) != "" {
				p.addf("%s is set but LEGACY_DB_USER is not: name the role the secret is for, or unset it", k)
			}
		}
	}
	for _, fn := range withSecret {
		prefix := strings.ToUpper(fn) + "_DB_"
		arn, password := get(prefix+"SECRET_ARN"), get(prefix+"PASSWORD")
		switch {
		case arn != "" && password != "":
			p.addf("set either %sSECRET_ARN (AWS) or %sPASSWORD (local), not both", prefix, prefix)
		case arn != "":
			if !strings.HasPrefix(arn, "arn:") || !strings.Contains(arn, ":secretsmanager:") {
				p.addf("%sSECRET_ARN=%q: must be a Secrets Manager ARN", prefix, arn)
			}
			c.SecretARNs[fn] = arn
		case password != "":
			if err := approle.CheckPassword(password); err != nil {
				p.addf("%sPASSWORD: %v", prefix, err)
			}
			switch fn {
			case "webhook":
				c.Passwords.Webhook = password
			case "worker":
				c.Passwords.Worker = password
			case "legacy":
				c.Passwords.Legacy = password
			case "ops":
				c.Passwords.Ops = password
			case "reconcile":
				c.Passwords.Reconcile = password
			case "ingest":
				c.Passwords.Ingest = password
			case "writeback":
				c.Passwords.Writeback = password
			default:
				c.Passwords.Purge = password
			}
		case fn == "ops":
			p.addf("no password for OPS_DB_USER=%s: set OPS_DB_SECRET_ARN=arn:aws:secretsmanager:... (AWS) or OPS_DB_PASSWORD (local)", c.Roles.Ops)
		case fn == "legacy":
			p.addf("no password for LEGACY_DB_USER=%s: set LEGACY_DB_SECRET_ARN=arn:aws:secretsmanager:... (AWS; the role's existing secret) or LEGACY_DB_PASSWORD (local)", c.Roles.Legacy)
		default:
			p.addf("no password for the %s's role: set %sSECRET_ARN=arn:aws:secretsmanager:... (AWS) or %sPASSWORD (local)", fn, prefix, prefix)
		}
	}
	c.ConnectWait = p.durationIn(env, "CONNECT_WAIT", 4*time.Minute, 0, 14*time.Minute)
	return c, p.err()
}
