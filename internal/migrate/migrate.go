// Package migrate applies the embedded SQL migrations to a PostgreSQL
// database. It is the project's only migration runner: the local runner, the
// test-database helper and the deploy-time migration function all call Up.
//
// Up is safe to run concurrently from several processes (a session advisory
// lock serialises runners) and safe to re-run (applied versions are recorded
// in schema_migrations with a checksum, and skipped). A migration whose file
// changed after it was applied is refused rather than silently ignored.
package migrate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/stripe-inbox/inbox/migrations"
)

// lockKey is the advisory lock key that serialises migration runners. It is
// an arbitrary constant ("inbox-mi" as ASCII) that no other code uses.
const lockKey int64 = 0x696e626f782d6d69

var fileName = regexp.MustCompile(`^(\d{4})_[a-z0-9_]+\.sql$`)

// Migration is one SQL file.
type Migration struct {
	Version  string // "0001"
	Name     string // "0001_webhook_inbox.sql"
	SQL      string
	Checksum string // hex sha256 of SQL
}

// Load reads the migrations from fsys in version order. It rejects files that
// do not follow the naming rule and duplicate versions, so a mistake in the
// migrations folder fails every test rather than a deploy.
func Load(fsys fs.FS) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, fmt.Errorf("reading migrations: %w", err)
	}
	var out []Migration
	seen := map[string]string{}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".sql") {
			continue
		}
		m := fileName.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fmt.Errorf("migration file %q must be named NNNN_lower_snake_case.sql", e.Name())
		}
		if prev, dup := seen[m[1]]; dup {
			return nil, fmt.Errorf("migration files %q and %q share version %s", prev, e.Name(), m[1])
		}
		seen[m[1]] = e.Name()
		body, err := fs.ReadFile(fsys, e.Name())
		if err != nil {
			return nil, fmt.Errorf("reading migration %s: %w", e.Name(), err)
		}
		sum := sha256.Sum256(body)
		out = append(out, Migration{Version: m[1], Name: e.Name(), SQL: string(body), Checksum: hex.EncodeToString(sum[:])})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// All returns the project's embedded migrations.
func All() ([]Migration, error) { return Load(migrations.FS) }

// Result says what Up did.
type Result struct {
	Applied []string // names applied by this call
	Current string   // the newest version now in the database
}

// ErrChecksumMismatch means a migration file changed after it was applied.
var ErrChecksumMismatch = errors.New("an applied migration's file has changed")

// Up applies the project's pending migrations over conn. conn must be a
// dedicated connection (not a pooled one shared with other work) because the
// advisory lock is held on its session.
func Up(ctx context.Context, conn *pgx.Conn) (Result, error) {
	ms, err := All()
	if err != nil {
		return Result{}, err
	}
	return Apply(ctx, conn, ms)
}

// Apply applies the given migrations; Up is Apply with the embedded set.
func Apply(ctx context.Context, conn *pgx.Conn, ms []Migration) (res Result, err error) {
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", lockKey); err != nil {
		return res, fmt.Errorf("taking the migration lock: %w", err)
	}
	defer func() {
		// Unlock on a context that cannot be cancelled: a cancelled ctx must
		// not leave the lock held on a connection that goes back to use.
		if _, uerr := conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", lockKey); uerr != nil && err == nil {
			err = fmt.Errorf("releasing the migration lock: %w", uerr)
		}
	}()

	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    text        PRIMARY KEY,
		name       text        NOT NULL,
		checksum   text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now()
	)`); err != nil {
		return res, fmt.Errorf("creating schema_migrations: %w", err)
	}

	applied := map[string]string{}
	rows, err := conn.Query(ctx, "SELECT version, checksum FROM schema_migrations")
	if err != nil {
		return res, fmt.Errorf("reading schema_migrations: %w", err)
	}
	for rows.Next() {
		var v, sum string
		if err := rows.Scan(&v, &sum); err != nil {
			return res, fmt.Errorf("reading schema_migrations: %w", err)
		}
		applied[v] = sum
	}
	if err := rows.Err(); err != nil {
		return res, fmt.Errorf("reading schema_migrations: %w", err)
	}

	for _, m := range ms {
		if sum, ok := applied[m.Version]; ok {
			if sum != m.Checksum {
				return res, fmt.Errorf("%w: %s (add a new migration instead of editing one that has been applied)", ErrChecksumMismatch, m.Name)
			}
			res.Current = m.Version
			continue
		}
		if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, $2, $3)", m.Version, m.Name, m.Checksum)
			return err
		}); err != nil {
			return res, fmt.Errorf("applying migration %s: %w", m.Name, err)
		}
		res.Applied = append(res.Applied, m.Name)
		res.Current = m.Version
	}
	return res, nil
}
