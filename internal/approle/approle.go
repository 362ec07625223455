// Package approle keeps the database roles of a deployment in the shape the
// functions need, and runs the deploy-time database step (roles, migrations,
// grants) that the migrate function performs.
//
// Roles (names are configuration; the stack's are in parentheses):
//
//   - the owner (inbox_schema_owner): NOLOGIN. It owns every object of schema
//     public, and migrations run as it (the master user SET ROLEs to it), so
//     nobody logs in as the owner of the schema.
//
//   - the webhook's user (inbox_webhook): INSERT on the columns of
//     webhook_inbox a receipt is stored with, SELECT of the receipt key
//     (provider, endpoint, event_id), and SELECT and UPDATE of duplicates (a
//     duplicate delivery counts itself). Nothing else: it cannot read
//     payloads, change a receipt otherwise, delete one, or touch any other
//     table.
//
//   - the reconciler's store function's user (inbox_reconcile; optional,
//     Roles.Reconcile): the webhook's INSERT on webhook_inbox (store a
//     receipt, read back its key), and SELECT, INSERT and UPDATE on
//     reconcile_high_water (the reconciler's mark). Nothing else.
//
//   - the purge's user (inbox_purge): what internal/retention runs: SELECT
//     and DELETE on webhook_inbox and outbox, UPDATE of webhook_inbox.payload and
//     payload_raw (scrubbing) and of outbox.created_at (only so that its batches may
//     lock rows FOR UPDATE). Nothing on the business tables.
//
//   - the worker's user (inbox_worker): SELECT, INSERT, UPDATE and DELETE on
//     every other table of schema public (now and, through default
//     privileges, every table a later migration creates), SELECT and UPDATE
//     on webhook_inbox (claims, outcomes), nothing on schema_migrations.
//
//   - the operators' user (inbox_ops; optional, Roles.Ops): what internal/ops
//     runs for inboxctl: SELECT on webhook_inbox and the business tables it
//     shows, UPDATE of webhook_inbox.attempts and available_at (retry),
//     UPDATE of anomalies.resolved_at and resolution (resolve), UPDATE of
//     outbox.attempts, available_at, leased_until and claim_token
//     (outbox-retry; never published_at or the payload), and INSERT
//     and SELECT on ops_audit. It cannot store, process, delete or scrub
//     receipts, book money, change or delete an audit row, or touch a table
//     a later migration creates until a release grants it here.
//
// None of them may create, alter or drop objects; only the worker may create
// temporary tables (the database's TEMPORARY privilege is taken from PUBLIC).
//
// The earlier release's shared login (inbox_app) is retired in two phases, so
// that neither the deploy window nor a rollback cuts the previous functions
// off the database:
//
//   - kept (Roles.Legacy; the stack's default): if the role exists, it keeps
//     exactly what the earlier release gave it: LOGIN with its secret's
//     password, CONNECT and TEMPORARY on the database, USAGE on the schema,
//     SELECT, INSERT, UPDATE and DELETE on every table (including the tables
//     later migrations create, which the owner now owns), USAGE and SELECT on
//     the sequences, and SELECT only on schema_migrations. It is never
//     created: a database where it never existed (a new stack) does not get it.
//   - retired (Roles.Retired; the stack's retireLegacyAppRole=true, a later
//     deploy): stripped of every privilege and made NOLOGIN; an operator
//     drops it. The step refuses to retire a role while the functions' own
//     roles do not exist yet: that deploy would switch the functions and
//     lock out the role the running ones use in one go.
//
// The deploy step connects as the RDS master user. On RDS that user is not a
// PostgreSQL superuser: it is created NOSUPERUSER with CREATEROLE and CREATEDB
// and is a member of rds_superuser, which lets it create roles and grant
// privileges
// (https://docs.aws.amazon.com/AmazonRDS/latest/UserGuide/Appendix.PostgreSQL.CommonDBATasks.Roles.rds_superuser.html).
// It owns the database RDS created for it (DatabaseName), and so schema public
// through pg_database_owner (PostgreSQL 15+). Everything here is therefore done
// with ordinary privileges: the master creates the roles (on PostgreSQL 16+ a
// CREATEROLE user gets ADMIN OPTION, but neither SET nor INHERIT, on the roles
// it creates, and needs that ADMIN OPTION for ALTER ROLE and GRANT), grants
// itself membership in the owner WITH INHERIT TRUE, SET TRUE (the explicit
// form of what createrole_self_grant would do,
// https://www.postgresql.org/docs/16/runtime-config-client.html#GUC-CREATEROLE-SELF-GRANT),
// hands the owner the objects it still owns itself (deployments before this
// change ran migrations as the master), and SET ROLEs to the owner for
// migrations and grants. The tests run the step as a non-superuser
// CREATEROLE login that owns the database, as the master is on RDS.
//
// The login roles reach PostgreSQL only through RDS Proxy. The functions
// authenticate to the proxy with IAM tokens; the proxy logs in to the
// database with the user name and password stored in each role's Secrets
// Manager secret (one secret per user, each registered with the proxy). So
// each role must exist with exactly that password and is never a member of
// rds_iam (on RDS that membership turns off password logins for the role,
// which would lock the proxy out).
package approle

import (
	"context"
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// RDSIAMRole is the role RDS uses to mark users that must log in with IAM
// tokens. It exists only on RDS.
const RDSIAMRole = "rds_iam"

// lockKey serialises deploy steps ("inbox-ro" as ASCII), so two deploys
// racing to create a role do not fail on a duplicate.
const lockKey int64 = 0x696e626f782d726f

// scramIterations is PostgreSQL's default (scram_iterations).
const scramIterations = 4096

// RoleName is the shape of a role name Ensure accepts: a plain lower-case
// identifier, so it never needs quoting in logs, IAM policies or URLs.
var RoleName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// ErrUnsafeRole means a role exists with an attribute it must not have
// (superuser, CREATEROLE, CREATEDB, REPLICATION, BYPASSRLS). The deploy step
// does not try to strip those (that takes a superuser, which the RDS master
// is not); an operator has to.
var ErrUnsafeRole = errors.New("a database role has privileges it must not have")

// WorkerStateColumns are the columns of webhook_inbox that only the worker
// writes (claims, attempts, outcomes). The webhook may insert every other
// column, including columns later migrations add; a migration that adds a
// column only the worker may write must add it here.
var WorkerStateColumns = []string{"received_at", "available_at", "attempts", "last_error", "processed_at", "outcome"}

// receiptKey is the part of a receipt the webhook may read back.
var receiptKey = []string{"provider", "endpoint", "event_id"}

// Roles names a deployment's database roles.
type Roles struct {
	// Owner owns the schema's objects; migrations run as it. NOLOGIN.
	Owner string
	// Webhook, Worker and Purge are the functions' login roles.
	Webhook string
	Worker  string
	Purge   string
	// Ops is the operations function's login role (inbox_ops), optional:
	// empty when the deployment has no ops function.
	Ops string
	// Reconcile is the reconciler's store function's login role; "" when
	// the deployment has none (it is optional so that a deploy step
	// configured before it existed keeps working).
	Reconcile string
	// Legacy is the login role the functions of the earlier release shared
	// (inbox_app), kept working as that release left it while the new
	// functions replace the old ones and a rollback may bring the old ones
	// back (see the package comment). Only an existing role is kept; it is
	// never created. Empty once it is retired.
	Legacy string
	// Retired are login roles of earlier releases (inbox_app, once the
	// operator has confirmed that the functions run as their own roles).
	// Each is stripped of every privilege in the database and made NOLOGIN;
	// an operator drops it once no rollback to the earlier release is
	// needed.
	Retired []string
}

// logins returns the login roles with the function each serves: the three
// functions', and the ops function's when it is configured.
func (r Roles) logins() [][2]string {
	l := r.functions()
	if r.Ops != "" {
		l = append(l, [2]string{"ops", r.Ops})
	}
	if r.Reconcile != "" {
		l = append(l, [2]string{"reconcile", r.Reconcile})
	}
	return l
}

// functions returns the roles of the three functions that process receipts.
func (r Roles) functions() [][2]string {
	return [][2]string{{"webhook", r.Webhook}, {"worker", r.Worker}, {"purge", r.Purge}}
}

// Validate checks the names: well-formed, distinct, and none of them master,
// the user the deploy step connects as.
func (r Roles) Validate(master string) error {
	var problems []string
	seen := map[string]string{}
	check := func(what, name string) {
		if name == "" {
			problems = append(problems, what+" is not set")
			return
		}
		if err := checkRoleName(name); err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", what, err))
		}
		if prev, dup := seen[name]; dup {
			problems = append(problems, fmt.Sprintf("%s and %s are both %q: each needs a role of its own", prev, what, name))
		}
		seen[name] = what
	}
	if master != "" {
		seen[master] = "the user the deploy step connects as (DB_USER)"
	}
	check("the schema owner role", r.Owner)
	for _, l := range r.functions() {
		check("the "+l[0]+"'s role", l[1])
	}
	if r.Ops != "" {
		check("the ops function's role", r.Ops)
	}
	if r.Reconcile != "" {
		check("the reconcile's role", r.Reconcile)
	}
	if r.Legacy != "" {
		check("the earlier release's shared role (kept)", r.Legacy)
	}
	for _, name := range r.Retired {
		check("retired role", name)
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

// Passwords are the login roles' passwords (from their secrets). Legacy is
// needed only when Roles.Legacy is set.
type Passwords struct {
	Webhook, Worker, Purge string
	Ops                    string // needed only when Roles.Ops is set
	Reconcile              string // needed only when Roles.Reconcile is set
	Legacy                 string
}

func (p Passwords) of(function string) string {
	switch function {
	case "webhook":
		return p.Webhook
	case "worker":
		return p.Worker
	case "ops":
		return p.Ops
	case "reconcile":
		return p.Reconcile
	default:
		return p.Purge
	}
}

// UserResult says what Prepare did to one login role.
type UserResult struct {
	Role          string `json:"role"`
	Created       bool   `json:"created"`
	RevokedRDSIAM bool   `json:"revoked_rds_iam"`
}

// Result says what the role steps did.
type Result struct {
	Owner        string `json:"owner"`
	OwnerCreated bool   `json:"owner_created"`
	// Reowned lists the objects handed from the connecting user (the
	// master) to the owner: the whole schema on the first deploy after
	// upgrading, nothing afterwards.
	Reowned []string     `json:"reowned"`
	Users   []UserResult `json:"users"`
	// Legacy is what was done to the earlier release's shared role: nil
	// when none is configured or it does not exist (a new stack).
	Legacy *UserResult `json:"legacy"`
	// Retired lists the retired roles that existed and were stripped.
	Retired []string `json:"retired"`
}

// Prepare is the deploy step's first part, run as the master user in one
// transaction before the migrations: it creates the owner role (or checks
// it), makes the master a member of it, gives it schema public's objects the
// master still owns, creates or updates the login roles with their
// passwords, lets them connect and use the schema (but not create in it),
// keeps the legacy role's login (if it exists), and retires the retired
// roles. It is idempotent.
func Prepare(ctx context.Context, conn *pgx.Conn, roles Roles, pw Passwords) (Result, error) {
	return prepare(ctx, conn, roles, pw, RDSIAMRole)
}

// prepare is Prepare with the IAM role's name injected, so tests can stand in
// a role of their own for rds_iam (role names are global to the cluster).
func prepare(ctx context.Context, conn *pgx.Conn, roles Roles, pw Passwords, iamRole string) (Result, error) {
	res := Result{Owner: roles.Owner, Reowned: []string{}, Users: []UserResult{}, Retired: []string{}}
	verifiers := map[string]string{}
	for _, l := range roles.logins() {
		v, err := scramVerifier(pw.of(l[0]))
		if err != nil {
			return res, fmt.Errorf("the %s's role %s: %w", l[0], l[1], err)
		}
		verifiers[l[0]] = v
	}
	if roles.Legacy != "" {
		v, err := scramVerifier(pw.Legacy)
		if err != nil {
			return res, fmt.Errorf("the earlier release's shared role %s: %w", roles.Legacy, err)
		}
		verifiers["legacy"] = v
	}
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", lockKey); err != nil {
			return fmt.Errorf("taking the role lock: %w", err)
		}
		var master, database string
		if err := tx.QueryRow(ctx, "SELECT current_user, current_database()").Scan(&master, &database); err != nil {
			return fmt.Errorf("reading the current user: %w", err)
		}
		if err := roles.Validate(master); err != nil {
			return err
		}
		db := pgx.Identifier{database}.Sanitize()
		if err := checkRetirement(ctx, tx, roles); err != nil {
			return err
		}

		created, err := ensureOwner(ctx, tx, roles.Owner, master)
		if err != nil {
			return err
		}
		res.OwnerCreated = created
		if res.Reowned, err = reown(ctx, tx, roles.Owner); err != nil {
			return err
		}

		// Temporary tables are a privilege of the database that PUBLIC
		// holds by default; of the functions only the worker keeps it
		// (nothing uses it today, but a handler may one day).
		if _, err := tx.Exec(ctx, "REVOKE TEMPORARY ON DATABASE "+db+" FROM PUBLIC"); err != nil {
			return fmt.Errorf("revoking temporary tables from PUBLIC: %w", err)
		}
		for _, l := range roles.logins() {
			u, err := ensureLogin(ctx, tx, l[1], verifiers[l[0]], iamRole)
			res.Users = append(res.Users, u)
			if err != nil {
				return err
			}
			role := pgx.Identifier{l[1]}.Sanitize()
			temp := "REVOKE TEMPORARY ON DATABASE " + db + " FROM " + role
			if l[0] == "worker" {
				temp = "GRANT TEMPORARY ON DATABASE " + db + " TO " + role
			}
			for _, stmt := range []string{
				"GRANT CONNECT ON DATABASE " + db + " TO " + role,
				temp,
				"GRANT USAGE ON SCHEMA public TO " + role,
				"REVOKE CREATE ON SCHEMA public FROM " + role,
			} {
				if _, err := tx.Exec(ctx, stmt); err != nil {
					return fmt.Errorf("%s: %w", stmt, err)
				}
			}
		}

		if roles.Legacy != "" {
			exists, err := roleExists(ctx, tx, roles.Legacy)
			if err != nil {
				return err
			}
			if exists {
				u, err := keepLegacy(ctx, tx, roles.Legacy, verifiers["legacy"], db, iamRole)
				res.Legacy = &u
				if err != nil {
					return err
				}
			}
		}

		for _, name := range roles.Retired {
			var exists bool
			if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)", name).Scan(&exists); err != nil {
				return fmt.Errorf("looking up role %s: %w", name, err)
			}
			if !exists {
				continue
			}
			role := pgx.Identifier{name}.Sanitize()
			// Table privileges are the owner's grants (ownership moved
			// them); Grant revokes those. Here: the login, the database,
			// the schema, and default privileges the master set for it.
			for _, stmt := range []string{
				"ALTER ROLE " + role + " NOLOGIN",
				"REVOKE ALL ON DATABASE " + db + " FROM " + role,
				"REVOKE ALL ON SCHEMA public FROM " + role,
				"ALTER DEFAULT PRIVILEGES IN SCHEMA public REVOKE ALL ON TABLES FROM " + role,
				"ALTER DEFAULT PRIVILEGES IN SCHEMA public REVOKE ALL ON SEQUENCES FROM " + role,
			} {
				if _, err := tx.Exec(ctx, stmt); err != nil {
					return fmt.Errorf("retiring role %s (%s): %w", name, stmt, err)
				}
			}
			res.Retired = append(res.Retired, name)
		}
		return nil
	})
	return res, err
}

func roleExists(ctx context.Context, tx pgx.Tx, name string) (bool, error) {
	var exists bool
	if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)", name).Scan(&exists); err != nil {
		return false, fmt.Errorf("looking up role %s: %w", name, err)
	}
	return exists, nil
}

// ErrRetiringTooEarly means the deploy step was asked to retire a role that
// exists while the functions' own roles do not: the functions still running
// use the retired role, and the deploy would lock them out before the new
// ones replace them.
var ErrRetiringTooEarly = errors.New("retiring a role the running functions still use")

// checkRetirement refuses to retire an existing role in a database where the
// functions' roles do not all exist yet: that is a deployment of the earlier
// release (the functions run as the role to retire) being upgraded and
// retired in one deploy. It fails before anything changes.
func checkRetirement(ctx context.Context, tx pgx.Tx, roles Roles) error {
	var live []string
	for _, name := range roles.Retired {
		exists, err := roleExists(ctx, tx, name)
		if err != nil {
			return err
		}
		if exists {
			live = append(live, name)
		}
	}
	if len(live) == 0 {
		return nil
	}
	var missing []string
	for _, l := range roles.functions() {
		exists, err := roleExists(ctx, tx, l[1])
		if err != nil {
			return err
		}
		if !exists {
			missing = append(missing, l[1])
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s would be retired, but the functions' roles %s do not exist yet, so the running functions still log in as %s; "+
		"deploy first without retiring it (stack setting retireLegacyAppRole=false, the default; RETIRED_DB_USERS empty and LEGACY_DB_USER=%s), "+
		"check that the webhook, worker and purge run as their own roles, then retire it in a later deploy",
		ErrRetiringTooEarly, strings.Join(live, ", "), strings.Join(missing, ", "), strings.Join(live, ", "), live[0])
}

// keepLegacy keeps the earlier release's shared login role working as that
// release's deploy step left it: LOGIN with the secret's password, no
// dangerous attribute, not a member of iamRole, CONNECT and TEMPORARY on
// the database (TEMPORARY it had through PUBLIC, which Prepare revokes),
// USAGE but not CREATE on the schema. Its table privileges are Grant's.
func keepLegacy(ctx context.Context, tx pgx.Tx, user, verifier, db, iamRole string) (UserResult, error) {
	res := UserResult{Role: user}
	role := pgx.Identifier{user}.Sanitize()
	if _, err := tx.Exec(ctx, fmt.Sprintf("ALTER ROLE %s WITH LOGIN INHERIT PASSWORD '%s'", role, verifier)); err != nil {
		return res, fmt.Errorf("keeping role %s: %w", user, err)
	}
	if err := checkAttributes(ctx, tx, user); err != nil {
		return res, err
	}
	revoked, err := revokeIAM(ctx, tx, user, iamRole)
	res.RevokedRDSIAM = revoked
	if err != nil {
		return res, err
	}
	for _, stmt := range []string{
		"GRANT CONNECT, TEMPORARY ON DATABASE " + db + " TO " + role,
		"GRANT USAGE ON SCHEMA public TO " + role,
		"REVOKE CREATE ON SCHEMA public FROM " + role,
	} {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			return res, fmt.Errorf("keeping role %s (%s): %w", user, stmt, err)
		}
	}
	return res, nil
}

// ensureOwner creates the NOLOGIN owner role if it is missing, refuses one
// with dangerous attributes, makes master a member that may SET ROLE to it
// and inherits its privileges (so the master can still administer the
// schema's objects, as an operator expects), and lets it use and create in
// schema public.
func ensureOwner(ctx context.Context, tx pgx.Tx, name, master string) (bool, error) {
	owner := pgx.Identifier{name}.Sanitize()
	var exists bool
	if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)", name).Scan(&exists); err != nil {
		return false, fmt.Errorf("looking up role %s: %w", name, err)
	}
	if !exists {
		if _, err := tx.Exec(ctx, "CREATE ROLE "+owner+" NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS"); err != nil {
			return false, fmt.Errorf("creating the owner role %s: %w", name, err)
		}
	} else if _, err := tx.Exec(ctx, "ALTER ROLE "+owner+" NOLOGIN"); err != nil {
		return false, fmt.Errorf("making the owner role %s NOLOGIN: %w", name, err)
	}
	if err := checkAttributes(ctx, tx, name); err != nil {
		return false, err
	}
	var version int
	if err := tx.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version); err != nil {
		return false, fmt.Errorf("reading the server version: %w", err)
	}
	grant := "GRANT " + owner + " TO " + pgx.Identifier{master}.Sanitize()
	if version >= 160000 {
		// PostgreSQL 16 split membership into ADMIN, INHERIT and SET; the
		// implicit grant a CREATEROLE user gets on a role it creates has
		// ADMIN only.
		grant += " WITH INHERIT TRUE, SET TRUE"
	}
	for _, stmt := range []string{grant, "GRANT USAGE, CREATE ON SCHEMA public TO " + owner} {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			return false, fmt.Errorf("%s: %w", stmt, err)
		}
	}
	return !exists, nil
}

// reown hands the owner the objects of schema public that the current user
// owns: tables, views, standalone sequences (an identity or serial sequence
// follows its table), routines and types, except members of extensions.
func reown(ctx context.Context, tx pgx.Tx, ownerName string) ([]string, error) {
	rows, err := tx.Query(ctx, `
SELECT CASE c.relkind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW' WHEN 'S' THEN 'SEQUENCE'
                      WHEN 'f' THEN 'FOREIGN TABLE' ELSE 'TABLE' END,
       format('public.%I', c.relname)
  FROM pg_class c
 WHERE c.relnamespace = 'public'::regnamespace
   AND c.relowner = (SELECT oid FROM pg_roles WHERE rolname = current_user)
   AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
   AND NOT EXISTS (SELECT 1 FROM pg_depend d
                    WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                      AND (d.deptype = 'e' OR (c.relkind = 'S' AND d.deptype IN ('a', 'i'))))
UNION ALL
SELECT 'ROUTINE', format('public.%I(%s)', p.proname, pg_get_function_identity_arguments(p.oid))
  FROM pg_proc p
 WHERE p.pronamespace = 'public'::regnamespace
   AND p.proowner = (SELECT oid FROM pg_roles WHERE rolname = current_user)
   AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e')
UNION ALL
SELECT CASE t.typtype WHEN 'd' THEN 'DOMAIN' ELSE 'TYPE' END, format('public.%I', t.typname)
  FROM pg_type t
 WHERE t.typnamespace = 'public'::regnamespace
   AND t.typowner = (SELECT oid FROM pg_roles WHERE rolname = current_user)
   AND t.typtype IN ('e', 'd', 'r', 'm')
   AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_type'::regclass AND d.objid = t.oid AND d.deptype = 'e')
 ORDER BY 1, 2`)
	if err != nil {
		return nil, fmt.Errorf("listing the objects to hand to the owner: %w", err)
	}
	type object struct{ kind, name string }
	objects, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (object, error) {
		var o object
		return o, r.Scan(&o.kind, &o.name)
	})
	if err != nil {
		return nil, fmt.Errorf("listing the objects to hand to the owner: %w", err)
	}
	out := []string{}
	owner := pgx.Identifier{ownerName}.Sanitize()
	for _, o := range objects {
		if _, err := tx.Exec(ctx, fmt.Sprintf("ALTER %s %s OWNER TO %s", o.kind, o.name, owner)); err != nil {
			return nil, fmt.Errorf("handing %s %s to the owner %s: %w", strings.ToLower(o.kind), o.name, ownerName, err)
		}
		out = append(out, o.name)
	}
	return out, nil
}

// ensureLogin creates the login role user, or updates it, so that it logs in
// with the password whose SCRAM verifier is given, has no dangerous
// attribute, and is not a member of iamRole.
func ensureLogin(ctx context.Context, tx pgx.Tx, user, verifier, iamRole string) (UserResult, error) {
	res := UserResult{Role: user}
	role := pgx.Identifier{user}.Sanitize()
	var exists bool
	if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)", user).Scan(&exists); err != nil {
		return res, fmt.Errorf("looking up role %s: %w", user, err)
	}
	// The verifier is base64 plus '$' and ':', so it needs no escaping, and
	// the plain password never appears in a statement (or a log).
	if exists {
		if _, err := tx.Exec(ctx, fmt.Sprintf("ALTER ROLE %s WITH LOGIN INHERIT PASSWORD '%s'", role, verifier)); err != nil {
			return res, fmt.Errorf("updating role %s: %w", user, err)
		}
	} else {
		if _, err := tx.Exec(ctx, fmt.Sprintf("CREATE ROLE %s WITH LOGIN INHERIT NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS PASSWORD '%s'", role, verifier)); err != nil {
			return res, fmt.Errorf("creating role %s: %w", user, err)
		}
		res.Created = true
	}
	if err := checkAttributes(ctx, tx, user); err != nil {
		return res, err
	}
	revoked, err := revokeIAM(ctx, tx, user, iamRole)
	res.RevokedRDSIAM = revoked
	return res, err
}

// Grant is the deploy step's last part, run after the migrations: as the
// owner (SET LOCAL ROLE, so the grants are the owner's), in one transaction,
// it takes every privilege on schema public's tables and sequences from the
// login roles and the retired roles and grants each login role exactly what
// its function needs (see the package comment), including the default
// privileges that give the worker the tables later migrations create. The
// legacy role, if it exists, gets back what the earlier release gave it, on
// every table, including those created since.
// Running it after each deploy's migrations is what lets the webhook insert
// columns later migrations add to webhook_inbox. conn must be the master's.
func Grant(ctx context.Context, conn *pgx.Conn, roles Roles) error {
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", lockKey); err != nil {
			return fmt.Errorf("taking the role lock: %w", err)
		}
		var master string
		if err := tx.QueryRow(ctx, "SELECT current_user").Scan(&master); err != nil {
			return fmt.Errorf("reading the current user: %w", err)
		}
		if err := roles.Validate(master); err != nil {
			return err
		}
		owner := pgx.Identifier{roles.Owner}.Sanitize()
		if _, err := tx.Exec(ctx, "SET LOCAL ROLE "+owner); err != nil {
			return fmt.Errorf("becoming the owner %s: %w", roles.Owner, err)
		}
		columns, err := webhookColumns(ctx, tx)
		if err != nil {
			return err
		}
		// A retired role that never existed here (a stack created after
		// it was retired) has nothing to revoke.
		var retired []string
		if err := tx.QueryRow(ctx, "SELECT coalesce(array_agg(rolname ORDER BY rolname), '{}') FROM pg_roles WHERE rolname = ANY ($1)",
			roles.Retired).Scan(&retired); err != nil {
			return fmt.Errorf("looking up the retired roles: %w", err)
		}
		roles.Retired = retired
		// Nor does a legacy role that never existed (a new stack): it is
		// not created, so it gets nothing.
		if roles.Legacy != "" {
			exists, err := roleExists(ctx, tx, roles.Legacy)
			if err != nil {
				return err
			}
			if !exists {
				roles.Legacy = ""
			}
		}
		for _, stmt := range grants(roles, columns) {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return fmt.Errorf("granting privileges (%s): %w", stmt, err)
			}
		}
		return nil
	})
}

// webhookColumns lists the columns of webhook_inbox the webhook may insert:
// all but WorkerStateColumns.
func webhookColumns(ctx context.Context, tx pgx.Tx) ([]string, error) {
	rows, err := tx.Query(ctx, `
SELECT attname FROM pg_attribute
 WHERE attrelid = 'public.webhook_inbox'::regclass AND attnum > 0 AND NOT attisdropped
   AND attgenerated = ''
 ORDER BY attnum`)
	if err != nil {
		return nil, fmt.Errorf("listing the columns of webhook_inbox: %w", err)
	}
	all, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("listing the columns of webhook_inbox: %w", err)
	}
	var out []string
	for _, c := range all {
		if !slices.Contains(WorkerStateColumns, c) {
			out = append(out, c)
		}
	}
	return out, nil
}

func quoteAll(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = pgx.Identifier{n}.Sanitize()
	}
	return strings.Join(q, ", ")
}

// grants are the statements, run as the owner, that give each login role
// exactly its function's privileges and take everything from retired roles.
func grants(roles Roles, webhookInsert []string) []string {
	q := func(name string) string { return pgx.Identifier{name}.Sanitize() }
	owner, webhook, worker, purge := q(roles.Owner), q(roles.Webhook), q(roles.Worker), q(roles.Purge)
	var out []string
	// Start from nothing, so a privilege an earlier release (or an
	// operator) granted does not linger.
	all := append([]string{roles.Webhook, roles.Worker, roles.Purge}, roles.Retired...)
	if roles.Legacy != "" {
		all = append(all, roles.Legacy)
	}
	if roles.Ops != "" {
		all = append(all, roles.Ops)
	}
	if roles.Reconcile != "" {
		all = append(all, roles.Reconcile)
	}
	for _, name := range all {
		r := q(name)
		out = append(out,
			"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM "+r,
			"REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM "+r,
			"ALTER DEFAULT PRIVILEGES FOR ROLE "+owner+" IN SCHEMA public REVOKE ALL ON TABLES FROM "+r,
			"ALTER DEFAULT PRIVILEGES FOR ROLE "+owner+" IN SCHEMA public REVOKE ALL ON SEQUENCES FROM "+r,
		)
	}
	out = append(out,
		// The webhook: store a receipt, and read back only its key (the
		// INSERT ... ON CONFLICT DO NOTHING RETURNING of internal/inbox).
		"GRANT INSERT ("+quoteAll(webhookInsert)+") ON public.webhook_inbox TO "+webhook,
		"GRANT SELECT ("+quoteAll(receiptKey)+") ON public.webhook_inbox TO "+webhook,
		// A duplicate delivery counts itself on the stored receipt
		// (inbox.CountDuplicate: UPDATE ... SET duplicates = duplicates + 1,
		// its row picked FOR UPDATE SKIP LOCKED): UPDATE and SELECT of that
		// one column.
		"GRANT SELECT (duplicates), UPDATE (duplicates) ON public.webhook_inbox TO "+webhook,

		// The purge (internal/retention): delete processed receipts and
		// published outbox rows, scrub payloads. Its batches pick rows by
		// ctid, which a column grant cannot cover, so SELECT is the table's.
		// They lock the rows they pick (FOR UPDATE SKIP LOCKED), which
		// PostgreSQL allows only with UPDATE on at least one column: on
		// webhook_inbox that is payload and payload_raw (scrubbing), on outbox created_at,
		// the one column whose change neither the dispatcher (payload,
		// published_at) nor the retention (published_at) reads.
		"GRANT SELECT, DELETE ON public.webhook_inbox, public.outbox TO "+purge,
		"GRANT UPDATE (payload, payload_raw) ON public.webhook_inbox TO "+purge,
		"GRANT UPDATE (created_at) ON public.outbox TO "+purge,

		// The worker: everything else, now and in later migrations.
		"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO "+worker,
		"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO "+worker,
		"REVOKE INSERT, DELETE ON public.webhook_inbox FROM "+worker,
		"REVOKE ALL ON public.schema_migrations FROM "+worker,
		// The operators' audit trail is written only by internal/ops
		// (the ops role, or the master): no function may change it.
		"REVOKE ALL ON public.ops_audit FROM "+worker,
		"ALTER DEFAULT PRIVILEGES FOR ROLE "+owner+" IN SCHEMA public GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO "+worker,
		"ALTER DEFAULT PRIVILEGES FOR ROLE "+owner+" IN SCHEMA public GRANT USAGE, SELECT ON SEQUENCES TO "+worker,
	)
	if roles.Ops != "" {
		out = append(out, opsGrants(q(roles.Ops))...)
	}
	if roles.Reconcile != "" {
		// The reconciler's store function (internal/reconcile.DBSink):
		// the webhook's INSERT with source 'reconcile', and its mark.
		reconcile := q(roles.Reconcile)
		out = append(out,
			"GRANT INSERT ("+quoteAll(webhookInsert)+") ON public.webhook_inbox TO "+reconcile,
			"GRANT SELECT ("+quoteAll(receiptKey)+") ON public.webhook_inbox TO "+reconcile,
			"GRANT SELECT, INSERT, UPDATE ON public.reconcile_high_water TO "+reconcile,
		)
	}
	if roles.Legacy != "" {
		// The earlier release's shared role, while it is kept: what that
		// release's deploy step granted it (the functions it ran did all
		// three jobs), on every table the owner now owns, including tables
		// created since (refunds, payment_links) and later ones. So the
		// previous functions keep working during the deploy and after a
		// rollback, whatever migrations this release applied.
		legacy := q(roles.Legacy)
		out = append(out,
			"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO "+legacy,
			"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO "+legacy,
			"REVOKE INSERT, UPDATE, DELETE ON public.schema_migrations FROM "+legacy,
			"REVOKE INSERT, UPDATE, DELETE ON public.ops_audit FROM "+legacy,
			"ALTER DEFAULT PRIVILEGES FOR ROLE "+owner+" IN SCHEMA public GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO "+legacy,
			"ALTER DEFAULT PRIVILEGES FOR ROLE "+owner+" IN SCHEMA public GRANT USAGE, SELECT ON SEQUENCES TO "+legacy,
		)
	}
	return out
}

// opsGrants are the operators' role's privileges: exactly the statements of
// internal/ops (its reads, retry, resolve and the audit row). Table by
// table, so a table a later migration adds is not readable until a release
// decides it should be. The audit rows' identity column needs no sequence
// privilege.
func opsGrants(ops string) []string {
	return []string{
		"GRANT SELECT ON public.webhook_inbox, public.invoices, public.ledger_entries, public.outbox, public.anomalies TO " + ops,
		"GRANT UPDATE (attempts, available_at) ON public.webhook_inbox TO " + ops,
		"GRANT UPDATE (resolved_at, resolution) ON public.anomalies TO " + ops,
		// outbox-retry (outbox.RetryRows): fresh attempts, due now, no
		// lease; never published_at, the payload or last_error.
		"GRANT UPDATE (attempts, available_at, leased_until, claim_token) ON public.outbox TO " + ops,
		"GRANT SELECT, INSERT ON public.ops_audit TO " + ops,
	}
}

func checkRoleName(user string) error {
	switch {
	case !RoleName.MatchString(user):
		return fmt.Errorf("role name %q must be lower-case letters, digits and _ (at most 63), starting with a letter or _", user)
	case strings.HasPrefix(user, "pg_"), strings.HasPrefix(user, "rds"), user == "postgres", user == "public":
		return fmt.Errorf("role name %q is reserved by PostgreSQL or RDS", user)
	}
	return nil
}

// checkAttributes refuses a role that is more than a plain login.
func checkAttributes(ctx context.Context, tx pgx.Tx, user string) error {
	var super, createRole, createDB, replication, bypassRLS bool
	if err := tx.QueryRow(ctx,
		"SELECT rolsuper, rolcreaterole, rolcreatedb, rolreplication, rolbypassrls FROM pg_roles WHERE rolname = $1", user,
	).Scan(&super, &createRole, &createDB, &replication, &bypassRLS); err != nil {
		return fmt.Errorf("reading the attributes of role %s: %w", user, err)
	}
	var extra []string
	for _, a := range []struct {
		name string
		set  bool
	}{{"SUPERUSER", super}, {"CREATEROLE", createRole}, {"CREATEDB", createDB}, {"REPLICATION", replication}, {"BYPASSRLS", bypassRLS}} {
		if a.set {
			extra = append(extra, a.name)
		}
	}
	if len(extra) > 0 {
		return fmt.Errorf("%w: role %s has %s; remove with ALTER ROLE %s NO%s as a superuser",
			ErrUnsafeRole, user, strings.Join(extra, ", "), user, strings.Join(extra, " NO"))
	}
	return nil
}

// revokeIAM removes user from iamRole when that role exists and user is a
// member. On RDS a member of rds_iam can only log in with an IAM token, but
// RDS Proxy logs in to the database with the password from the secret.
func revokeIAM(ctx context.Context, tx pgx.Tx, user, iamRole string) (bool, error) {
	var member bool
	err := tx.QueryRow(ctx, `SELECT EXISTS (
		SELECT 1 FROM pg_auth_members m
		JOIN pg_roles g ON g.oid = m.roleid
		JOIN pg_roles u ON u.oid = m.member
		WHERE g.rolname = $1 AND u.rolname = $2)`, iamRole, user).Scan(&member)
	if err != nil {
		return false, fmt.Errorf("checking %s membership of %s: %w", iamRole, user, err)
	}
	if !member {
		return false, nil
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf("REVOKE %s FROM %s", pgx.Identifier{iamRole}.Sanitize(), pgx.Identifier{user}.Sanitize())); err != nil {
		return false, fmt.Errorf("revoking %s from %s (RDS Proxy logs in with the secret's password, which %s forbids): %w", iamRole, user, iamRole, err)
	}
	return true, nil
}

// scramVerifier hashes password the way PostgreSQL stores it
// (SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>, RFC 5802 and
// RFC 7677), so the server receives a verifier rather than the password.
func scramVerifier(password string) (string, error) {
	salt := make([]byte, 16)
	if _, err := rand.Read(salt); err != nil {
		return "", fmt.Errorf("generating a salt: %w", err)
	}
	return scramVerifierWithSalt(password, salt, scramIterations)
}

func scramVerifierWithSalt(password string, salt []byte, iterations int) (string, error) {
	if err := CheckPassword(password); err != nil {
		return "", err
	}
	salted, err := pbkdf2.Key(sha256.New, password, salt, iterations, sha256.Size)
	if err != nil {
		return "", fmt.Errorf("deriving the SCRAM key: %w", err)
	}
	clientKey := hmacSHA256(salted, "Client Key")
	storedKey := sha256.Sum256(clientKey)
	serverKey := hmacSHA256(salted, "Server Key")
	b64 := base64.StdEncoding.EncodeToString
	return fmt.Sprintf("SCRAM-SHA-256$%d:%s$%s:%s", iterations, b64(salt), b64(storedKey[:]), b64(serverKey)), nil
}

func hmacSHA256(key []byte, msg string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(msg))
	return m.Sum(nil)
}

// CheckPassword accepts printable ASCII of a sensible length: SASLprep (which
// PostgreSQL applies before hashing) leaves such passwords unchanged, so the
// verifier computed here matches the one the server would compute.
func CheckPassword(password string) error {
	if len(password) < 16 || len(password) > 256 {
		return fmt.Errorf("the password must be 16 to 256 characters, got %d", len(password))
	}
	for _, r := range password {
		if r < 0x21 || r > 0x7e {
			return errors.New("the password must be printable ASCII without spaces")
		}
	}
	return nil
}

// PasswordFromSecret extracts the password from a secret in the standard RDS
// DatabaseSecret shape ({"username": ..., "password": ...}) and checks that
// the secret is the one for user.
func PasswordFromSecret(text, user string) (string, error) {
	var s struct {
		Username string `json:"username"`
		Password string `json:"password"`
	}
	if err := json.Unmarshal([]byte(text), &s); err != nil {
		return "", fmt.Errorf("the secret of role %s is not JSON with username and password fields", user)
	}
	if s.Username != user {
		return "", fmt.Errorf("the secret is for user %q, but the role is %q", s.Username, user)
	}
	if err := CheckPassword(s.Password); err != nil {
		return "", fmt.Errorf("the secret of role %s: %w", user, err)
	}
	return s.Password, nil
}
