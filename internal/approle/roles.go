package approle

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
)

// RDSIAMRole is the role RDS uses to mark users that must log in with IAM
// tokens. It exists only on RDS.
const RDSIAMRole = "rds_iam"

// RoleName is the shape of a role name Ensure accepts: a plain lower-case
// identifier, so it never needs quoting in logs, IAM policies or URLs.
var RoleName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// ErrUnsafeRole means a role exists with an attribute it must not have
// (superuser, CREATEROLE, CREATEDB, REPLICATION, BYPASSRLS). The deploy step
// does not try to strip those (that takes a superuser, which the RDS master
// is not); an operator has to.
var ErrUnsafeRole = errors.New("a database role has privileges it must not have")

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
	// Ingest is the EventBridge ingest function's login role (inbox_ingest;
	// internal/ingest); "" when the deployment has none.
	Ingest string
	// Writeback is the write-back sender's store function's login role
	// (inbox_writeback; internal/writeback.DBStore); "" when the deployment
	// has none.
	Writeback string
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
	if r.Ingest != "" {
		l = append(l, [2]string{"ingest", r.Ingest})
	}
	if r.Writeback != "" {
		l = append(l, [2]string{"writeback", r.Writeback})
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
	if r.Ingest != "" {
		check("the ingest's role", r.Ingest)
	}
	if r.Writeback != "" {
		check("the write-back store's role", r.Writeback)
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
		// holds by default; no function keeps it (the worker had it until
		// issue 23, unused: nothing it runs creates one).
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
			for _, stmt := range []string{
				"GRANT CONNECT ON DATABASE " + db + " TO " + role,
				"REVOKE TEMPORARY ON DATABASE " + db + " FROM " + role,
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
		"this is the upgrade from the release whose functions shared it: deploy once with the stack setting keepLegacyAppRole=true "+
		"(cdk deploy -c keepLegacyAppRole=true; RETIRED_DB_USERS empty and LEGACY_DB_USER=%s), check that the webhook, worker and purge "+
		"run as their own roles, then deploy again without the setting, which retires it",
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
