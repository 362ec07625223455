package approle

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/pgtest"
)

type testBundle struct {
	ctx   context.Context
	db    *pgtest.Database
	owner *pgx.Conn
	role  string
}

// setup gives a test a migrated database, an owner connection to it and a
// role name of its own. Role names are global to the cluster, so the role is
// dropped (with its privileges) when the test ends.
func setup(t *testing.T) *testBundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	db := pgtest.DB(t)
	b := &testBundle{ctx: ctx, db: db, role: uniqueName("inbox_app_t")}
	dropRoleOnCleanup(t, db, b.role)
	b.owner = db.Connect(t)
	return b
}

func uniqueName(prefix string) string {
	buf := make([]byte, 5)
	_, _ = rand.Read(buf)
	return prefix + "_" + hex.EncodeToString(buf)
}

func dropRoleOnCleanup(t *testing.T, db *pgtest.Database, role string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		ident := pgx.Identifier{role}.Sanitize()
		var exists bool
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)", role).Scan(&exists))
		if !exists {
			return
		}
		// DROP OWNED removes the role's privileges here and on shared
		// objects (the database's CONNECT grant), so DROP ROLE can succeed.
		_, err := db.Pool.Exec(ctx, "DROP OWNED BY "+ident)
		require.NoError(t, err)
		_, err = db.Pool.Exec(ctx, "DROP ROLE "+ident)
		require.NoError(t, err)
	})
}

// connectAs opens a connection to the test database as role. The test server
// trusts local connections, so the password is checked separately (see
// requirePassword).
func connectAs(t *testing.T, b *testBundle, role, password string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(b.db.URL)
	require.NoError(t, err)
	cfg.User, cfg.Password = role, password
	conn, err := pgx.ConnectConfig(b.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// requirePassword checks that the stored SCRAM verifier of role accepts
// password: it recomputes the verifier from the stored salt and iterations.
func requirePassword(t *testing.T, b *testBundle, role, password string) {
	t.Helper()
	stored := storedVerifier(t, b, role)
	salt, iterations := parseVerifier(t, stored)
	want, err := scramVerifierWithSalt(password, salt, iterations)
	require.NoError(t, err)
	require.Equal(t, want, stored, "the stored verifier does not match the password")
}

func storedVerifier(t *testing.T, b *testBundle, role string) string {
	t.Helper()
	var stored string
	require.NoError(t, b.owner.QueryRow(b.ctx, "SELECT rolpassword FROM pg_authid WHERE rolname = $1", role).Scan(&stored))
	return stored
}

func parseVerifier(t *testing.T, v string) ([]byte, int) {
	t.Helper()
	rest, ok := strings.CutPrefix(v, "SCRAM-SHA-256$")
	require.True(t, ok, "not a SCRAM verifier: %s", v)
	iterSalt, _, ok := strings.Cut(rest, "$")
	require.True(t, ok)
	iter, salt64, ok := strings.Cut(iterSalt, ":")
	require.True(t, ok)
	n, err := strconv.Atoi(iter)
	require.NoError(t, err)
	salt, err := base64.StdEncoding.DecodeString(salt64)
	require.NoError(t, err)
	return salt, n
}

func requireSQLState(t *testing.T, err error, code string) {
	t.Helper()
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "want PostgreSQL error %s, got %v", code, err)
	require.Equal(t, code, pgErr.Code, pgErr.Message)
}

const (
	password1 = "first-Password-0123456789"
	password2 = "second-Password-9876543210"
)

func TestEnsureCreatesLoginRole(t *testing.T) {
	t.Parallel()
	b := setup(t)

	res, err := Ensure(b.ctx, b.owner, b.role, password1)
	require.NoError(t, err)
	require.Equal(t, Result{Role: b.role, Created: true}, res)

	var login, super, createRole, createDB bool
	require.NoError(t, b.owner.QueryRow(b.ctx,
		"SELECT rolcanlogin, rolsuper, rolcreaterole, rolcreatedb FROM pg_roles WHERE rolname = $1", b.role,
	).Scan(&login, &super, &createRole, &createDB))
	require.True(t, login)
	require.False(t, super)
	require.False(t, createRole)
	require.False(t, createDB)
	requirePassword(t, b, b.role, password1)
}

func TestEnsureIsIdempotent(t *testing.T) {
	t.Parallel()
	b := setup(t)

	_, err := Ensure(b.ctx, b.owner, b.role, password1)
	require.NoError(t, err)
	res, err := Ensure(b.ctx, b.owner, b.role, password1)
	require.NoError(t, err)
	require.False(t, res.Created)
	requirePassword(t, b, b.role, password1)

	// Privileges are not duplicated or widened by the second run.
	var acl string
	require.NoError(t, b.owner.QueryRow(b.ctx,
		"SELECT array_to_string(relacl, ',') FROM pg_class WHERE oid = 'webhook_inbox'::regclass").Scan(&acl))
	require.Contains(t, acl, b.role+"=arwd/")
	require.Equal(t, 1, strings.Count(acl, b.role+"="))
}

func TestEnsureChangesPasswordOnRerun(t *testing.T) {
	t.Parallel()
	b := setup(t)

	_, err := Ensure(b.ctx, b.owner, b.role, password1)
	require.NoError(t, err)
	_, err = Ensure(b.ctx, b.owner, b.role, password2)
	require.NoError(t, err)

	requirePassword(t, b, b.role, password2)
	salt, iterations := parseVerifier(t, storedVerifier(t, b, b.role))
	old, err := scramVerifierWithSalt(password1, salt, iterations)
	require.NoError(t, err)
	require.NotEqual(t, old, storedVerifier(t, b, b.role))
}

func TestEnsureGrantsDMLButNoDDL(t *testing.T) {
	t.Parallel()
	b := setup(t)

	_, err := Ensure(b.ctx, b.owner, b.role, password1)
	require.NoError(t, err)
	app := connectAs(t, b, b.role, password1)

	// DML on the application's tables, and sequences through identity columns.
	_, err = app.Exec(b.ctx, `INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, payload)
		VALUES ('stripe', 'billing', 'evt_1', 'invoice.paid', false, '{}')`)
	require.NoError(t, err)
	_, err = app.Exec(b.ctx, "UPDATE webhook_inbox SET attempts = attempts + 1 WHERE event_id = 'evt_1'")
	require.NoError(t, err)
	var n int
	require.NoError(t, app.QueryRow(b.ctx, "SELECT count(*) FROM webhook_inbox").Scan(&n))
	require.Equal(t, 1, n)
	_, err = app.Exec(b.ctx, "DELETE FROM webhook_inbox WHERE event_id = 'evt_1'")
	require.NoError(t, err)
	_, err = app.Exec(b.ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		VALUES ('invoice', 'in_1', 'invoice.paid', '{}')`)
	require.NoError(t, err)

	// No DDL, no TRUNCATE, and the migration ledger is read-only.
	_, err = app.Exec(b.ctx, "CREATE TABLE not_allowed (id int)")
	requireSQLState(t, err, "42501")
	_, err = app.Exec(b.ctx, "DROP TABLE webhook_inbox")
	requireSQLState(t, err, "42501")
	_, err = app.Exec(b.ctx, "ALTER TABLE webhook_inbox ADD COLUMN x int")
	requireSQLState(t, err, "42501")
	_, err = app.Exec(b.ctx, "TRUNCATE outbox")
	requireSQLState(t, err, "42501")
	_, err = app.Exec(b.ctx, "DELETE FROM schema_migrations")
	requireSQLState(t, err, "42501")
	require.NoError(t, app.QueryRow(b.ctx, "SELECT count(*) FROM schema_migrations").Scan(&n))
	require.Positive(t, n)
}

func TestEnsureCoversTablesOfLaterMigrations(t *testing.T) {
	t.Parallel()
	b := setup(t)

	_, err := Ensure(b.ctx, b.owner, b.role, password1)
	require.NoError(t, err)
	// A later migration, run by the owner without another Ensure.
	_, err = b.owner.Exec(b.ctx, "CREATE TABLE later_table (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, note text)")
	require.NoError(t, err)

	app := connectAs(t, b, b.role, password1)
	_, err = app.Exec(b.ctx, "INSERT INTO later_table (note) VALUES ('x')")
	require.NoError(t, err)
	_, err = app.Exec(b.ctx, "DROP TABLE later_table")
	requireSQLState(t, err, "42501")
}

func TestEnsureRevokesIAMMembership(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A stand-in for rds_iam, which exists only on RDS.
	iamRole := uniqueName("rds_iam_t")
	_, err := b.owner.Exec(b.ctx, "CREATE ROLE "+iamRole)
	require.NoError(t, err)
	dropRoleOnCleanup(t, b.db, iamRole)

	_, err = ensure(b.ctx, b.owner, b.role, password1, iamRole)
	require.NoError(t, err)
	_, err = b.owner.Exec(b.ctx, fmt.Sprintf("GRANT %s TO %s", iamRole, b.role))
	require.NoError(t, err)

	res, err := ensure(b.ctx, b.owner, b.role, password1, iamRole)
	require.NoError(t, err)
	require.True(t, res.RevokedRDSIAM)
	var member bool
	require.NoError(t, b.owner.QueryRow(b.ctx, "SELECT pg_has_role($1, $2, 'MEMBER')", b.role, iamRole).Scan(&member))
	require.False(t, member)
}

func TestEnsureRefusesRoleWithExtraAttributes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.owner.Exec(b.ctx, "CREATE ROLE "+b.role+" LOGIN CREATEDB")
	require.NoError(t, err)

	_, err = Ensure(b.ctx, b.owner, b.role, password1)
	require.ErrorIs(t, err, ErrUnsafeRole)
	require.ErrorContains(t, err, "CREATEDB")
}

func TestEnsureRejectsBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)

	for _, tc := range []struct {
		name, user, password, want string
	}{
		{"upper-case name", "Inbox_App", password1, "lower-case"},
		{"quote in name", `inbox"app`, password1, "lower-case"},
		{"reserved name", "pg_app", password1, "reserved"},
		{"short password", b.role, "short", "16 to 256"},
		{"password with space", b.role, "has a space in it 0123456789", "printable ASCII"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Ensure(b.ctx, b.owner, tc.user, tc.password)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestEnsureRefusesTheOwnerItself(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// The test server's owner is postgres; use a role of ours as the owner.
	_, err := b.owner.Exec(b.ctx, "CREATE ROLE "+b.role+" LOGIN")
	require.NoError(t, err)
	_, err = b.owner.Exec(b.ctx, "SET ROLE "+b.role)
	require.NoError(t, err)

	_, err = Ensure(b.ctx, b.owner, b.role, password1)
	require.ErrorContains(t, err, "must differ from the owner")
	_, err = b.owner.Exec(b.ctx, "RESET ROLE")
	require.NoError(t, err)
}

// TestScramVerifierMatchesPostgreSQL checks the verifier against one the
// server computed itself from the plain password.
func TestScramVerifierMatchesPostgreSQL(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.owner.Exec(b.ctx, "SET password_encryption = 'scram-sha-256'")
	require.NoError(t, err)
	_, err = b.owner.Exec(b.ctx, fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD '%s'", b.role, password1))
	require.NoError(t, err)

	requirePassword(t, b, b.role, password1)
}
