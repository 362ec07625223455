// Package pgtest gives tests a real, migrated PostgreSQL database of their own.
// It is the project's only test-database helper; production code never
// imports it.
//
// The server comes from TEST_DATABASE_URL (scripts/test.sh sets it, starting a
// throwaway cluster when none is running), falling back to DATABASE_URL and
// then to the local default. A test that needs the database fails, never
// skips, when the server cannot be reached.
//
// DB(t) creates a fresh database cloned from a migrated template (a cheap
// file copy), so tests run in parallel without sharing rows, may commit, race
// several connections, or hand the URL to a child process. It is dropped when
// the test ends.
package pgtest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stripe-inbox/inbox/internal/migrate"
)

const defaultURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// templateLock serialises template creation across test binaries (go test
// runs packages in parallel, each in its own process).
const templateLock int64 = 0x696e626f782d7474

// ServerURL is the URL of the server tests run against (an admin database).
func ServerURL() string {
	for _, k := range []string{"TEST_DATABASE_URL", "DATABASE_URL"} {
		if v := os.Getenv(k); v != "" {
			return v
		}
	}
	return defaultURL
}

var (
	templateOnce sync.Once
	templateName string
	templateErr  error
)

// template returns the name of a database that has every migration applied.
// Its name carries a digest of the migrations, so a changed migration set
// gets a new template instead of reusing a stale one.
func template(ctx context.Context) (string, error) {
	templateOnce.Do(func() {
		templateName, templateErr = buildTemplate(ctx)
	})
	return templateName, templateErr
}

func buildTemplate(ctx context.Context) (string, error) {
	ms, err := migrate.All()
	if err != nil {
		return "", err
	}
	digest := ""
	for _, m := range ms {
		digest += m.Checksum
	}
	name := "inbox_tmpl_" + shortHash(digest)

	admin, err := pgx.Connect(ctx, ServerURL())
	if err != nil {
		return "", fmt.Errorf("pgtest: cannot reach PostgreSQL at %s (set TEST_DATABASE_URL, or run scripts/test.sh which starts one): %w", redact(ServerURL()), err)
	}
	defer admin.Close(context.WithoutCancel(ctx))

	if _, err := admin.Exec(ctx, "SELECT pg_advisory_lock($1)", templateLock); err != nil {
		return "", err
	}
	defer admin.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", templateLock) //nolint:errcheck

	var exists bool
	if err := admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return "", err
	}
	if exists {
		return name, nil
	}
	building := name + "_building"
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{building}.Sanitize()); err != nil {
		return "", err
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{building}.Sanitize()); err != nil {
		return "", err
	}
	conn, err := pgx.Connect(ctx, urlWithDatabase(ServerURL(), building))
	if err != nil {
		return "", err
	}
	_, err = migrate.Up(ctx, conn)
	conn.Close(context.WithoutCancel(ctx))
	if err != nil {
		return "", fmt.Errorf("pgtest: migrating template: %w", err)
	}
	// Rename only when complete, so a crashed build is never used.
	if _, err := admin.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s RENAME TO %s", pgx.Identifier{building}.Sanitize(), pgx.Identifier{name}.Sanitize())); err != nil {
		return "", err
	}
	return name, nil
}

// Database is a fresh migrated database owned by one test.
type Database struct {
	Name string
	URL  string
	Pool *pgxpool.Pool
}

// DB creates a database for t from the migrated template and drops it when t
// ends. Its pool has room for the connections a concurrency test opens; open
// more with Connect or by passing URL to a child process.
func DB(t testing.TB) *Database {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tmpl, err := template(ctx)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return create(ctx, t, tmpl)
}

// Empty creates a database with no migrations applied, for testing the
// migration runner itself.
func Empty(t testing.TB) *Database {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return create(ctx, t, "template0")
}

func create(ctx context.Context, t testing.TB, tmpl string) *Database {
	t.Helper()
	name := "inbox_test_" + randomSuffix()
	admin, err := pgx.Connect(ctx, ServerURL())
	if err != nil {
		t.Fatalf("pgtest: connecting to %s: %v", redact(ServerURL()), err)
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", pgx.Identifier{name}.Sanitize(), pgx.Identifier{tmpl}.Sanitize())); err != nil {
		t.Fatalf("pgtest: creating database from template: %v", err)
	}
	db := &Database{Name: name, URL: urlWithDatabase(ServerURL(), name)}
	t.Cleanup(func() {
		if db.Pool != nil {
			db.Pool.Close()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		admin, err := pgx.Connect(ctx, ServerURL())
		if err != nil {
			t.Errorf("pgtest: dropping %s: %v", name, err)
			return
		}
		defer admin.Close(ctx)
		if _, err := admin.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", pgx.Identifier{name}.Sanitize())); err != nil {
			t.Errorf("pgtest: dropping %s: %v", name, err)
		}
	})

	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	cfg.MaxConns = 20
	db.Pool, err = pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return db
}

// Connect opens a dedicated connection to the test database, closed when t
// ends. Concurrency tests give each goroutine its own.
func (d *Database) Connect(t testing.TB) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), d.URL)
	if err != nil {
		t.Fatalf("pgtest: connecting to %s: %v", d.Name, err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// Count returns SELECT count(*) FROM table [WHERE where], for assertions.
func (d *Database) Count(t testing.TB, table, where string, args ...any) int {
	t.Helper()
	q := "SELECT count(*) FROM " + pgx.Identifier{table}.Sanitize()
	if where != "" {
		q += " WHERE " + where
	}
	var n int
	if err := d.Pool.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatalf("pgtest: %s: %v", q, err)
	}
	return n
}

func urlWithDatabase(serverURL, db string) string {
	cfg, err := pgx.ParseConfig(serverURL)
	if err != nil {
		// ServerURL was already used to connect; a parse error here is a bug.
		panic(err)
	}
	// Rebuild a URL keyword/value DSN that keeps host, port, user, password and TLS settings.
	parts := []string{
		"host=" + cfg.Host,
		fmt.Sprintf("port=%d", cfg.Port),
		"user=" + cfg.User,
		"dbname=" + db,
	}
	if cfg.Password != "" {
		parts = append(parts, "password="+cfg.Password)
	}
	if cfg.TLSConfig == nil {
		parts = append(parts, "sslmode=disable")
	}
	return strings.Join(parts, " ")
}

func randomSuffix() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func shortHash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:6])
}

func redact(u string) string {
	cfg, err := pgx.ParseConfig(u)
	if err != nil {
		return "(unparseable URL)"
	}
	return fmt.Sprintf("%s@%s:%d/%s", cfg.User, cfg.Host, cfg.Port, cfg.Database)
}

// WaitUntil polls cond (a query returning one boolean) on the test database
// until it is true, for at most 30 seconds, and fails t otherwise. Tests use
// it to wait for a state of the server (a session blocked on a lock, a killed
// client's transaction gone) instead of sleeping for a guessed time.
func (d *Database) WaitUntil(t testing.TB, what, cond string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		var ok bool
		if err := d.Pool.QueryRow(context.Background(), cond).Scan(&ok); err != nil {
			t.Fatalf("pgtest: waiting until %s: %v", what, err)
		}
		if ok {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("pgtest: gave up waiting until %s", what)
}

// MigrateBelow applies, on conn, the migrations whose version is below
// version: a database as an earlier release left it, for upgrade tests.
func MigrateBelow(t testing.TB, conn *pgx.Conn, version string) {
	t.Helper()
	all, err := migrate.All()
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	var before []migrate.Migration
	for _, m := range all {
		if m.Version < version {
			before = append(before, m)
		}
	}
	if _, err := migrate.Apply(context.Background(), conn, before); err != nil {
		t.Fatalf("pgtest: migrating below %s: %v", version, err)
	}
}

// WaitForLockWaiter waits until some session of the test database waits on a
// lock.
func (d *Database) WaitForLockWaiter(t testing.TB) {
	t.Helper()
	d.WaitUntil(t, "a session waits on a lock",
		`SELECT count(*) > 0 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`)
}
