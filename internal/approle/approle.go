// Package approle keeps the application's database role in the shape the
// webhook, worker and purge functions need, and runs the deploy-time database
// step (migrations, then the role) that the migrate function performs.
//
// The application role (inbox_app) reaches PostgreSQL only through RDS Proxy.
// The functions authenticate to the proxy with IAM tokens; the proxy logs in
// to the database with the user name and password stored in the role's
// Secrets Manager secret. So the role must exist with exactly that password,
// must be able to read and write rows, and must be able to do nothing else:
// it is never a superuser, never creates or drops objects, and is not a member
// of rds_iam (on RDS that membership turns off password logins for the role,
// which would lock the proxy out).
package approle

import (
	"context"
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
)

// RDSIAMRole is the role RDS uses to mark users that must log in with IAM
// tokens. It exists only on RDS.
const RDSIAMRole = "rds_iam"

// lockKey serialises Ensure calls ("inbox-ro" as ASCII), so two deploys
// racing to create the role do not fail on a duplicate.
const lockKey int64 = 0x696e626f782d726f

// scramIterations is PostgreSQL's default (scram_iterations).
const scramIterations = 4096

// RoleName is the shape of a role name Ensure accepts: a plain lower-case
// identifier, so it never needs quoting in logs, IAM policies or URLs.
var RoleName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// ErrUnsafeRole means the role exists with an attribute the application must
// not have (superuser, CREATEROLE, CREATEDB, REPLICATION, BYPASSRLS). Ensure
// does not try to strip those (that takes a superuser, which the RDS owner is
// not); an operator has to.
var ErrUnsafeRole = errors.New("the application role has privileges it must not have")

// Result says what Ensure did.
type Result struct {
	Role          string `json:"role"`
	Created       bool   `json:"created"`
	RevokedRDSIAM bool   `json:"revoked_rds_iam"`
}

// Ensure creates the login role user, or updates it, so that it logs in with
// password and holds exactly SELECT, INSERT, UPDATE and DELETE on the tables
// and USAGE and SELECT on the sequences of schema public (now and, through
// default privileges, on the tables later migrations create as the current
// user). schema_migrations stays read-only to it. It runs in one transaction
// and is idempotent; conn must be the owner's connection.
func Ensure(ctx context.Context, conn *pgx.Conn, user, password string) (Result, error) {
	return ensure(ctx, conn, user, password, RDSIAMRole)
}

// ensure is Ensure with the IAM role's name injected, so tests can stand in a
// role of their own for rds_iam (role names are global to the cluster).
func ensure(ctx context.Context, conn *pgx.Conn, user, password, iamRole string) (Result, error) {
	res := Result{Role: user}
	if err := checkRoleName(user); err != nil {
		return res, err
	}
	verifier, err := scramVerifier(password)
	if err != nil {
		return res, err
	}
	role := pgx.Identifier{user}.Sanitize()
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", lockKey); err != nil {
			return fmt.Errorf("taking the role lock: %w", err)
		}
		var current, database string
		if err := tx.QueryRow(ctx, "SELECT current_user, current_database()").Scan(&current, &database); err != nil {
			return fmt.Errorf("reading the current user: %w", err)
		}
		if current == user {
			return fmt.Errorf("the application role %q must differ from the owner that runs migrations (%q)", user, current)
		}
		var exists bool
		if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)", user).Scan(&exists); err != nil {
			return fmt.Errorf("looking up role %s: %w", user, err)
		}
		// The verifier is base64 plus '$' and ':', so it needs no escaping,
		// and the plain password never appears in a statement (or a log).
		if exists {
			if _, err := tx.Exec(ctx, fmt.Sprintf("ALTER ROLE %s WITH LOGIN INHERIT PASSWORD '%s'", role, verifier)); err != nil {
				return fmt.Errorf("updating role %s: %w", user, err)
			}
		} else {
			if _, err := tx.Exec(ctx, fmt.Sprintf("CREATE ROLE %s WITH LOGIN INHERIT NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS PASSWORD '%s'", role, verifier)); err != nil {
				return fmt.Errorf("creating role %s: %w", user, err)
			}
			res.Created = true
		}
		if err := checkAttributes(ctx, tx, user); err != nil {
			return err
		}
		revoked, err := revokeIAM(ctx, tx, user, iamRole)
		if err != nil {
			return err
		}
		res.RevokedRDSIAM = revoked
		for _, stmt := range grants(role, pgx.Identifier{database}.Sanitize()) {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return fmt.Errorf("granting privileges to %s (%s): %w", user, stmt, err)
			}
		}
		// The migration ledger is the runner's; the application may read it.
		var ledger bool
		if err := tx.QueryRow(ctx, "SELECT to_regclass('public.schema_migrations') IS NOT NULL").Scan(&ledger); err != nil {
			return fmt.Errorf("looking up schema_migrations: %w", err)
		}
		if ledger {
			if _, err := tx.Exec(ctx, "REVOKE INSERT, UPDATE, DELETE ON public.schema_migrations FROM "+role); err != nil {
				return fmt.Errorf("making schema_migrations read-only to %s: %w", user, err)
			}
		}
		return nil
	})
	return res, err
}

// grants are the statements that give role exactly the privileges the
// application needs and take away the ones it must not have.
func grants(role, database string) []string {
	return []string{
		"GRANT CONNECT ON DATABASE " + database + " TO " + role,
		"GRANT USAGE ON SCHEMA public TO " + role,
		"REVOKE CREATE ON SCHEMA public FROM " + role,
		"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO " + role,
		"REVOKE TRUNCATE, REFERENCES, TRIGGER ON ALL TABLES IN SCHEMA public FROM " + role,
		"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO " + role,
		"REVOKE UPDATE ON ALL SEQUENCES IN SCHEMA public FROM " + role,
		// Tables and sequences that later migrations create (as the current
		// user, the owner) get the same grants without another Ensure.
		"ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO " + role,
		"ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT USAGE, SELECT ON SEQUENCES TO " + role,
	}
}

func checkRoleName(user string) error {
	switch {
	case !RoleName.MatchString(user):
		return fmt.Errorf("application role name %q must be lower-case letters, digits and _ (at most 63), starting with a letter or _", user)
	case strings.HasPrefix(user, "pg_"), strings.HasPrefix(user, "rds"), user == "postgres":
		return fmt.Errorf("application role name %q is reserved by PostgreSQL or RDS", user)
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
	for name, set := range map[string]bool{"SUPERUSER": super, "CREATEROLE": createRole, "CREATEDB": createDB, "REPLICATION": replication, "BYPASSRLS": bypassRLS} {
		if set {
			extra = append(extra, name)
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
	if err := checkPassword(password); err != nil {
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

// checkPassword accepts printable ASCII of a sensible length: SASLprep (which
// PostgreSQL applies before hashing) leaves such passwords unchanged, so the
// verifier computed here matches the one the server would compute.
func checkPassword(password string) error {
	if len(password) < 16 || len(password) > 256 {
		return fmt.Errorf("the application role's password must be 16 to 256 characters, got %d", len(password))
	}
	for _, r := range password {
		if r < 0x21 || r > 0x7e {
			return errors.New("the application role's password must be printable ASCII without spaces")
		}
	}
	return nil
}
