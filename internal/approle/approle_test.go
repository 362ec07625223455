package approle

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/database"
	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/metrics"
	"github.com/stripe-inbox/inbox/internal/migrate"
	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/retention"
	"github.com/stripe-inbox/inbox/internal/stripeevent"
	"github.com/stripe-inbox/inbox/internal/stripetest"
	"github.com/stripe-inbox/inbox/internal/worker"
)

// deployment is one test's database and roles. Role names are global to the
// cluster, so every name is unique to the test and the roles are dropped
// (with their privileges) when it ends.
//
// master stands in for the RDS master user: a login with CREATEROLE and
// CREATEDB that owns the database (and so schema public, through
// pg_database_owner) but is not a superuser.
type deployment struct {
	ctx    context.Context
	db     *pgtest.Database
	master string
	roles  Roles
	pw     Passwords
}

func newDeployment(t *testing.T, db *pgtest.Database) *deployment {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	d := &deployment{
		ctx:    ctx,
		db:     db,
		master: uniqueName("master_t"),
		roles: Roles{
			Owner:   uniqueName("owner_t"),
			Webhook: uniqueName("webhook_t"),
			Worker:  uniqueName("worker_t"),
			Purge:   uniqueName("purge_t"),
		},
		pw: Passwords{Webhook: "webhook-Password-0123456789", Worker: "worker-Password-0123456789", Purge: "purge-Password-0123456789"},
	}
	dropRoleOnCleanup(t, db, d.master)
	for _, r := range []string{d.roles.Owner, d.roles.Webhook, d.roles.Worker, d.roles.Purge} {
		dropRoleOnCleanup(t, db, r)
	}
	for _, q := range []string{
		"CREATE ROLE " + d.master + " LOGIN NOSUPERUSER CREATEROLE CREATEDB",
		"ALTER DATABASE " + pgx.Identifier{db.Name}.Sanitize() + " OWNER TO " + d.master,
	} {
		_, err := db.Pool.Exec(ctx, q)
		require.NoError(t, err)
	}
	return d
}

// deployer is the migrate function's step, connecting as the master.
func (d *deployment) deployer(t *testing.T) *Deployer {
	return &Deployer{
		Connect:   func(ctx context.Context) (*pgx.Conn, error) { return pgx.ConnectConfig(ctx, d.config(t, d.master)) },
		Passwords: func(context.Context) (Passwords, error) { return d.pw, nil },
		Roles:     d.roles,
		Logger:    slog.New(slog.NewJSONHandler(io.Discard, nil)),
	}
}

func (d *deployment) deploy(t *testing.T) Summary {
	t.Helper()
	sum, err := d.deployer(t).Run(d.ctx)
	require.NoError(t, err)
	return sum
}

func (d *deployment) config(t *testing.T, role string) *pgx.ConnConfig {
	t.Helper()
	cfg, err := pgx.ParseConfig(d.db.URL)
	require.NoError(t, err)
	// The test server trusts local connections; passwords are checked
	// separately (requirePassword).
	cfg.User = role
	return cfg
}

// connectAs opens a connection to the test database as role.
func (d *deployment) connectAs(t *testing.T, role string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.ConnectConfig(d.ctx, d.config(t, role))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// dsnAs is the test database's DSN (keyword/value, see pgtest) for role.
func (d *deployment) dsnAs(t *testing.T, role string) string {
	t.Helper()
	_, err := pgx.ParseConfig(d.db.URL)
	require.NoError(t, err)
	require.NotContains(t, d.db.URL, "://", "pgtest URLs are keyword/value DSNs")
	return d.db.URL + " user=" + role // a later keyword wins
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
		// A database the role owns goes back to the test server's user,
		// so pgtest can drop it and DROP ROLE can succeed.
		rows, err := db.Pool.Query(ctx, "SELECT datname FROM pg_database WHERE datdba = (SELECT oid FROM pg_roles WHERE rolname = $1)", role)
		require.NoError(t, err)
		owned, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		for _, name := range owned {
			_, err := db.Pool.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{name}.Sanitize()+" OWNER TO CURRENT_USER")
			require.NoError(t, err)
		}
		// DROP OWNED removes the role's objects and privileges here and on
		// shared objects (the database's CONNECT grant).
		_, err = db.Pool.Exec(ctx, "DROP OWNED BY "+ident)
		require.NoError(t, err)
		_, err = db.Pool.Exec(ctx, "DROP ROLE "+ident)
		require.NoError(t, err)
	})
}

// requirePassword checks that the stored SCRAM verifier of role accepts
// password: it recomputes the verifier from the stored salt and iterations.
func requirePassword(t *testing.T, db *pgtest.Database, role, password string) {
	t.Helper()
	stored := storedVerifier(t, db, role)
	salt, iterations := parseVerifier(t, stored)
	want, err := scramVerifierWithSalt(password, salt, iterations)
	require.NoError(t, err)
	require.Equal(t, want, stored, "the stored verifier of %s does not match the password", role)
}

func storedVerifier(t *testing.T, db *pgtest.Database, role string) string {
	t.Helper()
	var stored string
	require.NoError(t, db.Pool.QueryRow(context.Background(), "SELECT rolpassword FROM pg_authid WHERE rolname = $1", role).Scan(&stored))
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

func requireSQLState(t *testing.T, err error, code string, msgAndArgs ...any) {
	t.Helper()
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "want PostgreSQL error %s, got %v (%v)", code, err, msgAndArgs)
	require.Equal(t, code, pgErr.Code, "%s %v", pgErr.Message, msgAndArgs)
}

// requireDenied runs each statement on conn and requires permission denied
// (42501) for every one.
func requireDenied(t *testing.T, conn *pgx.Conn, statements ...string) {
	t.Helper()
	for _, q := range statements {
		_, err := conn.Exec(context.Background(), q)
		requireSQLState(t, err, "42501", q)
	}
}

// ddl is what no function's role may do.
var ddl = []string{
	"CREATE TABLE not_allowed (id int)",
	"ALTER TABLE webhook_inbox ADD COLUMN x int",
	"ALTER TABLE invoices ADD COLUMN x int",
	"DROP TABLE outbox",
	"CREATE INDEX not_allowed ON ledger_entries (amount)",
	"TRUNCATE webhook_inbox",
	"TRUNCATE ledger_entries",
	"INSERT INTO schema_migrations (version, name, checksum) VALUES ('9999', 'x', 'x')",
	"DELETE FROM schema_migrations",
}

// receive verifies a signed event and stores it through db, as the webhook
// does.
func receive(t *testing.T, db inbox.DB, payload []byte) inbox.StoreOutcome {
	t.Helper()
	ev, err := stripeevent.Verify(payload, stripetest.Sign(payload, time.Now(), "whsec_test"), []string{"whsec_test"})
	require.NoError(t, err)
	out, err := inbox.Store(context.Background(), db, "billing", ev)
	require.NoError(t, err)
	return out
}

const (
	password1 = "first-Password-0123456789"
	password2 = "second-Password-9876543210"
)

// TestDeployAsNonSuperuserMaster: the deploy step, run by a master user that
// is not a superuser (as on RDS), creates the NOLOGIN owner and the three
// login roles, applies every migration as the owner, and is a no-op the
// second time.
func TestDeployAsNonSuperuserMaster(t *testing.T) {
	t.Parallel()
	d := newDeployment(t, pgtest.Empty(t))
	all, err := migrate.All()
	require.NoError(t, err)
	// A stack created after inbox_app was retired still lists it; one
	// created before lists it as the shared role to keep (the stack's
	// default), which is never created.
	d.roles.Retired = []string{uniqueName("never_existed_t")}
	d.roles.Legacy = uniqueName("never_existed_t")
	d.pw.Legacy = password1
	dropRoleOnCleanup(t, d.db, d.roles.Legacy)

	sum := d.deploy(t)
	require.Len(t, sum.Applied, len(all))
	require.Equal(t, all[len(all)-1].Version, sum.Current)
	require.True(t, sum.Roles.OwnerCreated)
	require.Empty(t, sum.Roles.Reowned, "a fresh database has nothing for the owner to take over")
	require.Empty(t, sum.Roles.Retired, "a retired role that does not exist is skipped")
	require.Nil(t, sum.Roles.Legacy, "the shared role to keep does not exist: it is not created")
	var legacyExists bool
	require.NoError(t, d.db.Pool.QueryRow(d.ctx, "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)", d.roles.Legacy).Scan(&legacyExists))
	require.False(t, legacyExists, "a new stack never gets the shared role")
	require.Len(t, sum.Roles.Users, 3)
	for _, u := range sum.Roles.Users {
		require.True(t, u.Created, u.Role)
	}

	var ownerLogin, masterSuper bool
	require.NoError(t, d.db.Pool.QueryRow(d.ctx, "SELECT rolcanlogin FROM pg_roles WHERE rolname = $1", d.roles.Owner).Scan(&ownerLogin))
	require.False(t, ownerLogin, "nobody logs in as the schema's owner")
	require.NoError(t, d.db.Pool.QueryRow(d.ctx, "SELECT rolsuper FROM pg_roles WHERE rolname = $1", d.master).Scan(&masterSuper))
	require.False(t, masterSuper)
	requireOwnedBy(t, d, d.roles.Owner)
	for role, pw := range map[string]string{d.roles.Webhook: d.pw.Webhook, d.roles.Worker: d.pw.Worker, d.roles.Purge: d.pw.Purge} {
		requirePassword(t, d.db, role, pw)
		var login, super, createRole, createDB bool
		require.NoError(t, d.db.Pool.QueryRow(d.ctx,
			"SELECT rolcanlogin, rolsuper, rolcreaterole, rolcreatedb FROM pg_roles WHERE rolname = $1", role,
		).Scan(&login, &super, &createRole, &createDB))
		require.Equal(t, []bool{true, false, false, false}, []bool{login, super, createRole, createDB}, role)
	}

	// A second deploy applies nothing, creates nothing, and does not
	// duplicate or widen privileges.
	acl := func() string {
		var acl string
		require.NoError(t, d.db.Pool.QueryRow(d.ctx, `SELECT (SELECT array_to_string(relacl, ',') FROM pg_class WHERE oid = 'webhook_inbox'::regclass) || ' ' ||
			string_agg(attname || ':' || array_to_string(attacl, ','), ' ' ORDER BY attnum)
			FROM pg_attribute WHERE attrelid = 'webhook_inbox'::regclass AND attacl IS NOT NULL`).Scan(&acl))
		return acl
	}
	before := acl()
	sum = d.deploy(t)
	require.Empty(t, sum.Applied)
	require.NotNil(t, sum.Applied, "applied must marshal as [] in the summary")
	require.False(t, sum.Roles.OwnerCreated)
	require.Empty(t, sum.Roles.Reowned)
	for _, u := range sum.Roles.Users {
		require.False(t, u.Created, u.Role)
	}
	require.Equal(t, before, acl())
	require.Equal(t, 17, strings.Count(acl(), d.roles.Worker+"="), "one entry per column the worker reads or updates")
}

// requireOwnedBy checks every relation of schema public belongs to owner.
func requireOwnedBy(t *testing.T, d *deployment, owner string) {
	t.Helper()
	rows, err := d.db.Pool.Query(d.ctx, `SELECT c.relname FROM pg_class c
		WHERE c.relnamespace = 'public'::regnamespace AND pg_get_userbyid(c.relowner) <> $1`, owner)
	require.NoError(t, err)
	others, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Empty(t, others, "objects of schema public not owned by the owner role")
	var tables int
	require.NoError(t, d.db.Pool.QueryRow(d.ctx, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").Scan(&tables))
	require.GreaterOrEqual(t, tables, 6)
}

// TestWebhookRoleMayOnlyStoreReceipts: the internet-facing webhook's role
// stores receipts (new and duplicate) and can do nothing else.
func TestWebhookRoleMayOnlyStoreReceipts(t *testing.T) {
	t.Parallel()
	d := newDeployment(t, pgtest.Empty(t))
	d.deploy(t)
	webhook := d.connectAs(t, d.roles.Webhook)

	// What the webhook function does (internal/inbox.Store).
	require.Equal(t, inbox.Stored, receive(t, webhook, stripetest.Event("evt_1", "invoice.paid", stripetest.Invoice("in_1", "cus_1", "paid", 1000))))
	require.Equal(t, inbox.Duplicate, receive(t, webhook, stripetest.Event("evt_1", "invoice.paid", stripetest.Invoice("in_1", "cus_1", "paid", 1000))))
	var n int
	require.NoError(t, webhook.QueryRow(d.ctx, "SELECT count(*) FROM webhook_inbox WHERE provider = 'stripe' AND endpoint = 'billing' AND event_id = 'evt_1'").Scan(&n))
	require.Equal(t, 1, n, "the webhook may read the receipt keys")

	// With NOTIFY=on the webhook's insert also wakes resident workers
	// (inbox.StoreAndNotify): pg_notify needs no grant, and the worker's
	// role hears it.
	listener := d.connectAs(t, d.roles.Worker)
	require.NoError(t, inbox.Listen(d.ctx, listener))
	payload := stripetest.Event("evt_notify", "invoice.paid", stripetest.Invoice("in_2", "cus_1", "paid", 1000))
	ev, err := stripeevent.Verify(payload, stripetest.Sign(payload, time.Now(), "whsec_test"), []string{"whsec_test"})
	require.NoError(t, err)
	out, err := inbox.StoreAndNotify(d.ctx, webhook, "billing", ev)
	require.NoError(t, err)
	require.Equal(t, inbox.Stored, out)
	waitCtx, cancel := context.WithTimeout(d.ctx, 30*time.Second)
	defer cancel()
	note, err := listener.WaitForNotification(waitCtx)
	require.NoError(t, err)
	require.Equal(t, inbox.NotifyChannel, note.Channel)

	// The endpoint's delivery of an event the reconciler listed first
	// replaces the listed copy while the receipt is unprocessed
	// (inbox.Store's ON CONFLICT DO UPDATE), and is a duplicate once it is
	// processed.
	for _, id := range []string{"evt_listed", "evt_listed_done"} {
		listed, err := stripeevent.Parse(withAPIVersion(t, stripetest.Event(id, "invoice.paid", stripetest.Invoice("in_"+id, "cus_1", "paid", 1000)), "2024-06-20"))
		require.NoError(t, err)
		out, err := inbox.StoreFrom(d.ctx, d.db.Pool, inbox.SourceReconcile, "billing", listed)
		require.NoError(t, err)
		require.Equal(t, inbox.Stored, out)
	}
	_, err = d.db.Pool.Exec(d.ctx, "UPDATE webhook_inbox SET processed_at = now(), outcome = 'applied' WHERE event_id = 'evt_listed_done'")
	require.NoError(t, err)
	require.Equal(t, inbox.Replaced, receive(t, webhook, stripetest.Event("evt_listed", "invoice.paid", stripetest.Invoice("in_evt_listed", "cus_1", "paid", 1000))))
	require.Equal(t, inbox.Duplicate, receive(t, webhook, stripetest.Event("evt_listed_done", "invoice.paid", stripetest.Invoice("in_evt_listed_done", "cus_1", "paid", 1000))))
	require.Equal(t, 1, d.db.Count(t, "webhook_inbox", "event_id = 'evt_listed' AND source = 'webhook' AND listed_first AND api_version = $1 AND secret_fingerprint IS NOT NULL", stripetest.APIVersion))
	require.Equal(t, 1, d.db.Count(t, "webhook_inbox", "event_id = 'evt_listed_done' AND source = 'reconcile' AND listed_first AND api_version = '2024-06-20'"))

	requireDenied(t, webhook,
		// Receipts: no reading their content, no changing or deleting them,
		// no setting the worker's state on insert.
		"SELECT payload FROM webhook_inbox",
		"SELECT * FROM webhook_inbox",
		"UPDATE webhook_inbox SET processed_at = now(), outcome = 'applied'",
		"UPDATE webhook_inbox SET processed_at = NULL",
		"UPDATE webhook_inbox SET attempts = 0, available_at = now()",
		// The columns a delivery replaces, outside a delivery replacing a
		// listed copy of an unprocessed receipt: refused by the table's
		// content guard (migrations/0014_listed_first.sql), for a delivered
		// receipt, a processed one, or one going back to 'reconcile'.
		"UPDATE webhook_inbox SET payload = '{}'",
		"UPDATE webhook_inbox SET payload = '{}' WHERE event_id = 'evt_1'",
		"UPDATE webhook_inbox SET api_version = '2020-01-01' WHERE event_id = 'evt_listed'",
		"UPDATE webhook_inbox SET source = 'reconcile', listed_first = false WHERE event_id = 'evt_listed'",
		"UPDATE webhook_inbox SET payload = '{}', source = 'webhook', listed_first = true WHERE event_id = 'evt_listed_done'",
		// The store may not copy EXCLUDED's payload: that reads payload.
		`INSERT INTO webhook_inbox AS w (provider, endpoint, event_id, event_type, livemode, payload) VALUES ('stripe', 'billing', 'evt_1', 'invoice.paid', false, '{}')
			ON CONFLICT (provider, endpoint, event_id) DO UPDATE SET payload = EXCLUDED.payload RETURNING w.payload`,
		"DELETE FROM webhook_inbox",
		`INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, payload, processed_at, outcome)
			VALUES ('stripe', 'billing', 'evt_2', 'invoice.paid', false, '{}', now(), 'applied')`,
		`INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, payload, attempts)
			VALUES ('stripe', 'billing', 'evt_3', 'invoice.paid', false, '{}', 99)`,
		// The business tables and the outbox: nothing at all.
		"SELECT 1 FROM invoices", "INSERT INTO invoices (id, customer_id, status) VALUES ('in_x', 'cus_1', 'paid')",
		"UPDATE invoices SET amount_paid = 0", "DELETE FROM invoices",
		"SELECT 1 FROM ledger_entries", "INSERT INTO ledger_entries (invoice_id, kind, amount, event_id) VALUES ('in_x', 'payment', 1, 'evt_x')",
		"DELETE FROM ledger_entries",
		"SELECT 1 FROM outbox", "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('a', 'b', 'c', '{}')",
		"SELECT 1 FROM anomalies", "INSERT INTO anomalies (kind, subject_id, endpoint, event_id) VALUES ('k', 's', 'e', 'v')",
		"UPDATE anomalies SET resolved_at = now()",
		"SELECT 1 FROM schema_migrations",
		"CREATE TEMP TABLE scratch (id int)",
	)
	requireDenied(t, webhook, ddl...)
}

// withAPIVersion returns payload with its api_version replaced.
func withAPIVersion(t *testing.T, payload []byte, version string) []byte {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(payload, &m))
	m["api_version"] = version
	b, err := json.Marshal(m)
	require.NoError(t, err)
	return b
}

// TestPurgeRoleMayOnlyPurge: the purge's role runs internal/retention
// (delete and scrub) and cannot write the business tables.
func TestPurgeRoleMayOnlyPurge(t *testing.T) {
	t.Parallel()
	d := newDeployment(t, pgtest.Empty(t))
	d.deploy(t)
	now := time.Now()
	for _, q := range []string{
		`INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, payload, processed_at, outcome)
		 VALUES ('stripe', 'billing', 'evt_old', 'invoice.paid', false, '{"a": 1}', $1::timestamptz - interval '40 days', 'applied'),
		        ('stripe', 'billing', 'evt_mid', 'invoice.paid', false, '{"a": 1}', $1::timestamptz - interval '10 days', 'applied'),
		        ('stripe', 'billing', 'evt_new', 'invoice.paid', false, '{"a": 1}', NULL, NULL)`,
		`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, published_at)
		 VALUES ('invoice', 'in_1', 'x', '{}', $1::timestamptz - interval '40 days'), ('invoice', 'in_2', 'x', '{}', NULL)`,
		`INSERT INTO writeback_intents (kind, target, params, idempotency_key, event_id, status, done_at, result_via)
		 VALUES ('customer_metadata', 'cus_1', '{"metadata": {"k": "v"}}', 'k_old', 'evt_old', 'done', $1::timestamptz - interval '40 days', 'call'),
		        ('customer_metadata', 'cus_1', '{"metadata": {"k": "v"}}', 'k_pending', 'evt_new', 'pending', NULL, NULL)`,
	} {
		_, err := d.db.Pool.Exec(d.ctx, q, now)
		require.NoError(t, err)
	}
	purge := d.connectAs(t, d.roles.Purge)

	// What the purge function does.
	cfg := retention.Config{Retention: 30 * retention.Day, ScrubAfter: 7 * retention.Day}.WithDefaults()
	require.NoError(t, cfg.Validate())
	p, err := retention.New(purge, cfg, slog.New(slog.NewJSONHandler(io.Discard, nil)), metrics.New(io.Discard, "Test", nil))
	require.NoError(t, err)
	p.Now = func() *time.Time { return &now }
	s, err := p.Run(d.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, s.PurgedReceipts)
	require.EqualValues(t, 1, s.PurgedOutbox)
	require.EqualValues(t, 1, s.ScrubbedPayloads)
	require.Equal(t, 2, d.db.Count(t, "webhook_inbox", ""))
	require.Equal(t, 1, d.db.Count(t, "outbox", ""))
	require.EqualValues(t, 1, s.PurgedWritebacks)
	require.Equal(t, 1, d.db.Count(t, "writeback_intents", "status = 'pending'"))

	requireDenied(t, purge,
		"SELECT 1 FROM invoices", "INSERT INTO invoices (id, customer_id, status) VALUES ('in_x', 'cus_1', 'paid')",
		"UPDATE invoices SET amount_paid = 0", "DELETE FROM invoices",
		"SELECT 1 FROM ledger_entries", "INSERT INTO ledger_entries (invoice_id, kind, amount, event_id) VALUES ('in_x', 'payment', 1, 'evt_x')",
		"UPDATE ledger_entries SET amount = 0", "DELETE FROM ledger_entries",
		"SELECT 1 FROM anomalies", "UPDATE anomalies SET resolved_at = now()", "DELETE FROM anomalies",
		"INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('a', 'b', 'c', '{}')",
		"UPDATE outbox SET published_at = now()",
		`INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, payload)
			VALUES ('stripe', 'billing', 'evt_x', 'invoice.paid', false, '{}')`,
		"UPDATE webhook_inbox SET processed_at = NULL",
		"UPDATE webhook_inbox SET attempts = 0",
		"SELECT params FROM writeback_intents", "SELECT result FROM writeback_intents",
		"UPDATE writeback_intents SET status = 'done'",
		"INSERT INTO writeback_intents (kind, target, params, idempotency_key, event_id) VALUES ('customer_metadata', 'cus_x', '{}', 'k_x', 'evt_x')",
		"CREATE TEMP TABLE scratch (id int)",
	)
	requireDenied(t, purge, ddl...)
}

// TestLaterMigrationsReachTheirRoles: what a later migration needs. A new
// table is nobody's (no login role has default privileges, issue 23): not
// when the migration creates it, nor after the deploy step's Grant, until a
// release grants it in grants.go. A new column of webhook_inbox is
// insertable by the webhook after the deploy step's Grant, which every
// deploy runs after the migrations and before the functions are updated;
// the worker cannot read it.
func TestLaterMigrationsReachTheirRoles(t *testing.T) {
	t.Parallel()
	d := newDeployment(t, pgtest.Empty(t))
	d.deploy(t)

	all, err := migrate.All()
	require.NoError(t, err)
	later, err := migrate.Load(fstest.MapFS{"9001_later.sql": {Data: []byte(`
		CREATE TABLE later_charge_links (charge_id text PRIMARY KEY, invoice_id text NOT NULL, id bigint GENERATED ALWAYS AS IDENTITY);
		ALTER TABLE webhook_inbox ADD COLUMN later_raw bytea;`)}})
	require.NoError(t, err)
	master := d.connectAs(t, d.master)
	// As the deploy step runs migrations: SET ROLE to the owner.
	_, err = master.Exec(d.ctx, "SET ROLE "+d.roles.Owner)
	require.NoError(t, err)
	_, err = migrate.Apply(d.ctx, master, append(all, later...))
	require.NoError(t, err)
	_, err = master.Exec(d.ctx, "RESET ROLE")
	require.NoError(t, err)
	requireOwnedBy(t, d, d.roles.Owner)

	worker := d.connectAs(t, d.roles.Worker)
	laterTable := []string{"SELECT 1 FROM later_charge_links", "INSERT INTO later_charge_links (charge_id, invoice_id) VALUES ('ch_1', 'in_1')",
		"UPDATE later_charge_links SET invoice_id = 'in_2'", "DELETE FROM later_charge_links"}
	requireDenied(t, worker, laterTable...)
	webhook := d.connectAs(t, d.roles.Webhook)
	purge := d.connectAs(t, d.roles.Purge)
	insertRaw := `INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, payload, later_raw)
		VALUES ('stripe', 'billing', 'evt_raw', 'invoice.paid', false, '{}', '\x00'::bytea)`
	requireDenied(t, webhook, insertRaw)

	require.NoError(t, Grant(d.ctx, master, d.roles))
	_, err = webhook.Exec(d.ctx, insertRaw)
	require.NoError(t, err, "after the deploy step's Grant the webhook inserts the new column")
	requireDenied(t, webhook, "SELECT later_raw FROM webhook_inbox", "SELECT 1 FROM later_charge_links",
		"INSERT INTO later_charge_links (charge_id, invoice_id) VALUES ('ch_2', 'in_2')")
	requireDenied(t, purge, "SELECT 1 FROM later_charge_links", "DELETE FROM later_charge_links")
	requireDenied(t, worker, append(laterTable, "SELECT later_raw FROM webhook_inbox", "UPDATE webhook_inbox SET later_raw = NULL")...)
	var defaults int
	require.NoError(t, d.db.Pool.QueryRow(d.ctx, `SELECT count(*) FROM pg_default_acl, aclexplode(defaclacl) a
		WHERE a.grantee IN (SELECT oid FROM pg_roles WHERE rolname = ANY ($1))`,
		[]string{d.roles.Webhook, d.roles.Worker, d.roles.Purge}).Scan(&defaults))
	require.Zero(t, defaults, "no login role has default privileges")
}

// earlierRelease sets up what a deployment of the earlier release looks
// like: its migrations (0001 to 0003) run as the master, which owns the
// tables, and its deploy step's shared login role (inbox_app) with what that
// step granted it. It returns the shared role's name.
func earlierRelease(t *testing.T, d *deployment) string {
	t.Helper()
	legacy := uniqueName("inbox_app_t")
	dropRoleOnCleanup(t, d.db, legacy)
	all, err := migrate.All()
	require.NoError(t, err)
	var earlier []migrate.Migration
	for _, m := range all {
		if m.Version <= "0003" {
			earlier = append(earlier, m)
		}
	}
	require.Len(t, earlier, 3)
	master := d.connectAs(t, d.master)
	_, err = migrate.Apply(d.ctx, master, earlier)
	require.NoError(t, err)
	for _, q := range []string{
		"CREATE ROLE " + legacy + " LOGIN PASSWORD '" + password1 + "'",
		"GRANT CONNECT ON DATABASE " + pgx.Identifier{d.db.Name}.Sanitize() + " TO " + legacy,
		"GRANT USAGE ON SCHEMA public TO " + legacy,
		"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO " + legacy,
		"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO " + legacy,
		"REVOKE INSERT, UPDATE, DELETE ON public.schema_migrations FROM " + legacy,
		"ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO " + legacy,
		"ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT USAGE, SELECT ON SEQUENCES TO " + legacy,
	} {
		_, err := master.Exec(d.ctx, q)
		require.NoError(t, err, q)
	}
	require.NoError(t, master.Close(d.ctx))
	return legacy
}

// requireEarlierFunctionsWork does, as the shared role, what the earlier
// release's functions did: the webhook stores a receipt, the worker drains
// it (the real worker, on a pool as the worker function opens it), the
// purge runs, on the tables this release's migrations created too. An
// operator's temp table works as it did. The role still cannot change the
// schema or the migration ledger.
func requireEarlierFunctionsWork(t *testing.T, d *deployment, legacy, eventID string) {
	t.Helper()
	conn := d.connectAs(t, legacy)
	require.Equal(t, inbox.Stored, receive(t, conn, stripetest.Event(eventID, "invoice.paid", stripetest.Invoice("in_"+eventID, "cus_1", "paid", 1000))))
	// The earlier release's insert did not name payload_raw.
	_, err := conn.Exec(d.ctx, `INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, payload)
		VALUES ('stripe', 'billing', $1, 'customer.created', false, '{}')`, eventID+"_old")
	require.NoError(t, err)

	pool, err := database.Open(d.ctx, database.Config{URL: d.dsnAs(t, legacy), MaxConns: 3, PreparedStatements: true}, nil)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	cfg := worker.Config{Mode: worker.ModeTest, Concurrency: 1, StatementTimeout: time.Second, DeadlineMargin: 6 * time.Second, Lease: time.Minute}
	w, err := worker.New(pool, handlers.Default(), cfg, slog.New(slog.NewJSONHandler(io.Discard, nil)), metrics.New(io.Discard, "Test", nil))
	require.NoError(t, err)
	_, err = w.Run(d.ctx)
	require.NoError(t, err)
	var processed bool
	var lastError *string
	require.NoError(t, d.db.Pool.QueryRow(d.ctx, "SELECT processed_at IS NOT NULL, last_error FROM webhook_inbox WHERE event_id = $1", eventID).
		Scan(&processed, &lastError))
	require.Nil(t, lastError, "the worker as %s", legacy)
	require.True(t, processed, "the worker as %s", legacy)

	pcfg := retention.Config{Retention: 30 * retention.Day, ScrubAfter: 7 * retention.Day}.WithDefaults()
	p, err := retention.New(conn, pcfg, slog.New(slog.NewJSONHandler(io.Discard, nil)), metrics.New(io.Discard, "Test", nil))
	require.NoError(t, err)
	_, err = p.Run(d.ctx)
	require.NoError(t, err, "the purge as %s", legacy)

	for _, q := range []string{
		"INSERT INTO refunds (id, amount, status, succeeded) VALUES ('re_" + eventID + "', 100, 'succeeded', true)",
		"UPDATE refunds SET status = 'failed' WHERE id = 're_" + eventID + "'",
		"DELETE FROM refunds WHERE id = 're_" + eventID + "'",
		"INSERT INTO payment_links (payment_id, invoice_id) VALUES ('ch_" + eventID + "', 'in_1')",
		"UPDATE payment_links SET has_refunds = true WHERE payment_id = 'ch_" + eventID + "'",
		"SELECT payload_raw FROM webhook_inbox",
		"UPDATE webhook_inbox SET payload_raw = NULL WHERE event_id = '" + eventID + "'",
		"SELECT version FROM schema_migrations",
		"CREATE TEMP TABLE scratch (id int)",
	} {
		_, err := conn.Exec(d.ctx, q)
		require.NoError(t, err, q)
	}
	requireDenied(t, conn, ddl...)
	// The session's temporary table is the role's until the session ends.
	require.NoError(t, conn.Close(d.ctx))
}

// requireRetired checks that role cannot log in and holds no privilege on
// any table or sequence of schema public.
func requireRetired(t *testing.T, d *deployment, role string) {
	t.Helper()
	var login bool
	require.NoError(t, d.db.Pool.QueryRow(d.ctx, "SELECT rolcanlogin FROM pg_roles WHERE rolname = $1", role).Scan(&login))
	require.False(t, login)
	_, err := pgx.ConnectConfig(d.ctx, d.config(t, role))
	requireSQLState(t, err, "28000")
	rows, err := d.db.Pool.Query(d.ctx, `SELECT c.relname FROM pg_class c
		WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'S')
		  AND (CASE c.relkind WHEN 'S' THEN has_sequence_privilege($1, c.oid, 'USAGE, SELECT, UPDATE')
		       ELSE has_table_privilege($1, c.oid, 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER') END)`, role)
	require.NoError(t, err)
	privileged, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Empty(t, privileged, "the retired role keeps privileges")
}

// TestUpgradeRetiresTheSharedAppRoleInTwoDeploys: upgrading a deployment of
// the earlier release, whose functions all log in as the shared role
// (inbox_app).
//
// The first deploy (stack default) creates the functions' roles and hands
// the tables to the owner, but keeps the shared role working as before,
// on the tables this release's migrations add too: while CloudFormation
// updates the functions the old ones still run as it, and a rollback brings
// them back. A second deploy (the stack's default, without
// keepLegacyAppRole=true) strips it and takes
// its login. Rolling that deploy back (the first deploy's step runs again)
// restores it; after the second deploy the operator can drop it.
func TestUpgradeRetiresTheSharedAppRoleInTwoDeploys(t *testing.T) {
	t.Parallel()
	d := newDeployment(t, pgtest.Empty(t))
	legacy := earlierRelease(t, d)
	earlierWork := func(eventID string) { t.Helper(); requireEarlierFunctionsWork(t, d, legacy, eventID) }

	// Deploy 1: keepLegacyAppRole=true.
	d.roles.Legacy = legacy
	d.pw.Legacy = password1
	sum := d.deploy(t)
	require.Equal(t, migrationsAfter(t, "0003"), versions(sum.Applied))
	require.Subset(t, sum.Roles.Reowned, []string{"public.webhook_inbox", "public.invoices", "public.ledger_entries",
		"public.outbox", "public.anomalies", "public.schema_migrations"})
	require.Equal(t, &UserResult{Role: legacy}, sum.Roles.Legacy)
	require.Empty(t, sum.Roles.Retired)
	requireOwnedBy(t, d, d.roles.Owner)
	requirePassword(t, d.db, legacy, password1)
	earlierWork("evt_window")

	// The new functions work alongside.
	require.Equal(t, inbox.Stored, receive(t, d.connectAs(t, d.roles.Webhook),
		stripetest.Event("evt_new", "invoice.paid", stripetest.Invoice("in_new", "cus_1", "paid", 1000))))

	// Deploying again (any later release, same setting) keeps it working.
	sum = d.deploy(t)
	require.Empty(t, sum.Roles.Reowned)
	require.NotNil(t, sum.Roles.Legacy)
	earlierWork("evt_again")

	// Deploy 2: the stack's default (retired).
	phase2 := func() {
		t.Helper()
		d.roles.Legacy, d.pw.Legacy = "", ""
		d.roles.Retired = []string{legacy}
		sum := d.deploy(t)
		require.Equal(t, []string{legacy}, sum.Roles.Retired)
		require.Nil(t, sum.Roles.Legacy)
		requireRetired(t, d, legacy)
		require.Equal(t, inbox.Stored, receive(t, d.connectAs(t, d.roles.Webhook),
			stripetest.Event(uniqueName("evt"), "invoice.paid", stripetest.Invoice("in_2", "cus_1", "paid", 1000))))
	}
	phase2()

	// That deploy rolled back (the first deploy's step runs again), or the
	// operator turned the setting off again after it succeeded (then
	// CloudFormation had deleted the secret, and the new one has a new
	// password): the shared role works again, with the secret's password.
	d.roles.Legacy, d.pw.Legacy, d.roles.Retired = legacy, password2, nil
	d.deploy(t)
	requirePassword(t, d.db, legacy, password2)
	earlierWork("evt_rollback")

	phase2()
	_, err := d.connectAs(t, d.master).Exec(d.ctx, "DROP ROLE "+legacy)
	require.NoError(t, err, "nothing depends on the retired role any more")

	// Once dropped, the first deploy's setting does not bring it back.
	d.roles.Legacy, d.pw.Legacy, d.roles.Retired = legacy, password1, nil
	sum = d.deploy(t)
	require.Nil(t, sum.Roles.Legacy)
	var exists bool
	require.NoError(t, d.db.Pool.QueryRow(d.ctx, "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)", legacy).Scan(&exists))
	require.False(t, exists, "the shared role is never created")
}

// migrationsAfter lists the versions of the embedded migrations after v:
// what a deploy applies on top of a database the earlier release migrated.
func migrationsAfter(t *testing.T, v string) []string {
	t.Helper()
	all, err := migrate.All()
	require.NoError(t, err)
	var out []string
	for _, m := range all {
		if m.Version > v {
			out = append(out, m.Version)
		}
	}
	return out
}

func versions(applied []string) []string {
	out := make([]string, len(applied))
	for i, a := range applied {
		out[i], _, _ = strings.Cut(a, "_")
	}
	return out
}

// TestRetiringTheSharedAppRoleInTheUpgradeDeployIsRefused: retiring the
// shared role in the very deploy that creates the functions' roles would
// lock the running (earlier) functions out until CloudFormation replaces
// them, and for good if it rolls them back. The step refuses before it
// changes anything, which fails the deploy.
func TestRetiringTheSharedAppRoleInTheUpgradeDeployIsRefused(t *testing.T) {
	t.Parallel()
	d := newDeployment(t, pgtest.Empty(t))
	legacy := earlierRelease(t, d)
	d.roles.Retired = []string{legacy}

	_, err := d.deployer(t).Run(d.ctx)
	require.ErrorIs(t, err, ErrRetiringTooEarly)
	require.ErrorContains(t, err, "deploy once with the stack setting keepLegacyAppRole=true")
	require.Equal(t, 3, d.db.Count(t, "schema_migrations", ""), "nothing is migrated")
	var login bool
	require.NoError(t, d.db.Pool.QueryRow(d.ctx, "SELECT rolcanlogin FROM pg_roles WHERE rolname = $1", legacy).Scan(&login))
	require.True(t, login)
	var created bool
	require.NoError(t, d.db.Pool.QueryRow(d.ctx, "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)", d.roles.Webhook).Scan(&created))
	require.False(t, created, "nothing is created")
	// The earlier release's webhook still stores receipts as the shared role.
	_, err = d.connectAs(t, legacy).Exec(d.ctx, `INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, payload)
		VALUES ('stripe', 'billing', 'evt_refused', 'invoice.paid', false, '{}')`)
	require.NoError(t, err)
}

func TestDeployChangesPasswordsOnRerun(t *testing.T) {
	t.Parallel()
	d := newDeployment(t, pgtest.Empty(t))
	d.deploy(t)
	d.pw.Worker = password2
	d.deploy(t)

	requirePassword(t, d.db, d.roles.Worker, password2)
	requirePassword(t, d.db, d.roles.Webhook, d.pw.Webhook)
	salt, iterations := parseVerifier(t, storedVerifier(t, d.db, d.roles.Worker))
	old, err := scramVerifierWithSalt("worker-Password-0123456789", salt, iterations)
	require.NoError(t, err)
	require.NotEqual(t, old, storedVerifier(t, d.db, d.roles.Worker))
}

func TestDeployRevokesIAMMembership(t *testing.T) {
	t.Parallel()
	d := newDeployment(t, pgtest.Empty(t))
	// A stand-in for rds_iam, which exists only on RDS. The master creates
	// and grants it: from PostgreSQL 16 on, only a role with ADMIN OPTION on
	// a role may grant or revoke it, and a CREATEROLE role has that on the
	// roles it created (a role the superuser made would make the revoke fail
	// here for a reason that is not the one tested).
	master := d.connectAs(t, d.master)
	iamRole := uniqueName("rds_iam_t")
	_, err := master.Exec(d.ctx, "CREATE ROLE "+iamRole)
	require.NoError(t, err)
	dropRoleOnCleanup(t, d.db, iamRole)
	deployer := d.deployer(t)
	deployer.iamRole = iamRole

	_, err = deployer.Run(d.ctx)
	require.NoError(t, err)
	_, err = master.Exec(d.ctx, fmt.Sprintf("GRANT %s TO %s", iamRole, d.roles.Purge))
	require.NoError(t, err)

	sum, err := deployer.Run(d.ctx)
	require.NoError(t, err)
	require.Contains(t, sum.Roles.Users, UserResult{Role: d.roles.Purge, RevokedRDSIAM: true})
	var member bool
	require.NoError(t, d.db.Pool.QueryRow(d.ctx, "SELECT pg_has_role($1, $2, 'MEMBER')", d.roles.Purge, iamRole).Scan(&member))
	require.False(t, member)
}

func TestDeployRefusesRoleWithExtraAttributes(t *testing.T) {
	t.Parallel()
	d := newDeployment(t, pgtest.Empty(t))
	// Created by the master, as a role left by an earlier deploy would be:
	// from PostgreSQL 16 on, a CREATEROLE role may alter only the roles it
	// has ADMIN OPTION on, so one the superuser made fails with "permission
	// denied" before the attribute check this test is about.
	_, err := d.connectAs(t, d.master).Exec(d.ctx, "CREATE ROLE "+d.roles.Webhook+" LOGIN CREATEDB")
	require.NoError(t, err)

	_, err = d.deployer(t).Run(d.ctx)
	require.ErrorIs(t, err, ErrUnsafeRole)
	require.ErrorContains(t, err, "CREATEDB")
	var migrated bool
	require.NoError(t, d.db.Pool.QueryRow(d.ctx, "SELECT to_regclass('public.webhook_inbox') IS NOT NULL").Scan(&migrated))
	require.False(t, migrated, "nothing is migrated when the roles are wrong")
}

func TestRolesValidate(t *testing.T) {
	t.Parallel()
	ok := Roles{Owner: "inbox_schema_owner", Webhook: "inbox_webhook", Worker: "inbox_worker", Purge: "inbox_purge", Retired: []string{"inbox_app"}}
	require.NoError(t, ok.Validate("inbox_owner"))
	for _, tc := range []struct {
		name   string
		change func(*Roles)
		master string
		want   string
	}{
		{"upper-case name", func(r *Roles) { r.Webhook = "Inbox_Webhook" }, "", "lower-case"},
		{"quote in name", func(r *Roles) { r.Worker = `inbox"worker` }, "", "lower-case"},
		{"reserved name", func(r *Roles) { r.Purge = "pg_purge" }, "", "reserved"},
		{"shared role", func(r *Roles) { r.Purge = r.Worker }, "", "each needs a role of its own"},
		{"owner is the master", func(r *Roles) {}, "inbox_schema_owner", "DB_USER"},
		{"retired is in use", func(r *Roles) { r.Retired = []string{"inbox_worker"} }, "", "retired role"},
		{"missing", func(r *Roles) { r.Owner = "" }, "", "owner role is not set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := ok
			r.Retired = append([]string(nil), ok.Retired...)
			tc.change(&r)
			require.ErrorContains(t, r.Validate(tc.master), tc.want)
		})
	}
	_, err := scramVerifier("short")
	require.ErrorContains(t, err, "16 to 256")
	_, err = scramVerifier("has a space in it 0123456789")
	require.ErrorContains(t, err, "printable ASCII")
}

// TestScramVerifierMatchesPostgreSQL checks the verifier against one the
// server computed itself from the plain password.
func TestScramVerifierMatchesPostgreSQL(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	ctx := context.Background()
	role := uniqueName("scram_t")
	dropRoleOnCleanup(t, db, role)
	conn := db.Connect(t)
	_, err := conn.Exec(ctx, "SET password_encryption = 'scram-sha-256'")
	require.NoError(t, err)
	_, err = conn.Exec(ctx, fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD '%s'", role, password1))
	require.NoError(t, err)

	requirePassword(t, db, role, password1)
}
