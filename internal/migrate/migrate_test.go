package migrate_test

import (
	"context"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/migrate"
	"github.com/stripe-inbox/inbox/internal/pgtest"
)

func TestUpAppliesEverythingOnceAndIsReRunnable(t *testing.T) {
	t.Parallel()
	db := pgtest.Empty(t)
	ctx := context.Background()
	all, err := migrate.All()
	require.NoError(t, err)
	require.NotEmpty(t, all)

	first, err := migrate.Up(ctx, db.Connect(t))
	require.NoError(t, err)
	require.Len(t, first.Applied, len(all))
	require.Equal(t, all[len(all)-1].Version, first.Current)

	second, err := migrate.Up(ctx, db.Connect(t))
	require.NoError(t, err)
	require.Empty(t, second.Applied, "a second run must be a no-op")
	require.Equal(t, first.Current, second.Current)

	for _, table := range []string{"webhook_inbox", "invoices", "ledger_entries", "outbox"} {
		require.Equal(t, 0, db.Count(t, table, ""), table)
	}
	require.Equal(t, len(all), db.Count(t, "schema_migrations", ""))
}

func TestConcurrentRunnersApplyEachMigrationOnce(t *testing.T) {
	t.Parallel()
	db := pgtest.Empty(t)
	const runners = 6
	conns := make([]*pgx.Conn, runners)
	for i := range conns {
		conns[i] = db.Connect(t)
	}
	var wg sync.WaitGroup
	results := make([]migrate.Result, runners)
	errs := make([]error, runners)
	start := make(chan struct{})
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[i], errs[i] = migrate.Up(context.Background(), conns[i])
		}()
	}
	close(start)
	wg.Wait()

	all, err := migrate.All()
	require.NoError(t, err)
	applied := 0
	for i := range results {
		require.NoError(t, errs[i])
		applied += len(results[i].Applied)
	}
	require.Equal(t, len(all), applied, "every migration applied by exactly one runner")
	require.Equal(t, len(all), db.Count(t, "schema_migrations", ""))
}

func TestChangedMigrationIsRefused(t *testing.T) {
	t.Parallel()
	db := pgtest.Empty(t)
	ctx := context.Background()
	conn := db.Connect(t)
	v1 := fstest.MapFS{"0001_widgets.sql": {Data: []byte("CREATE TABLE widgets (id int);")}}
	ms, err := migrate.Load(v1)
	require.NoError(t, err)
	_, err = migrate.Apply(ctx, conn, ms)
	require.NoError(t, err)

	edited := fstest.MapFS{"0001_widgets.sql": {Data: []byte("CREATE TABLE widgets (id bigint);")}}
	ms, err = migrate.Load(edited)
	require.NoError(t, err)
	_, err = migrate.Apply(ctx, conn, ms)
	require.ErrorIs(t, err, migrate.ErrChecksumMismatch)
	require.ErrorContains(t, err, "0001_widgets.sql")
}

func TestFailingMigrationLeavesNothingBehind(t *testing.T) {
	t.Parallel()
	db := pgtest.Empty(t)
	ctx := context.Background()
	conn := db.Connect(t)
	ms, err := migrate.Load(fstest.MapFS{
		"0001_ok.sql":     {Data: []byte("CREATE TABLE ok (id int);")},
		"0002_broken.sql": {Data: []byte("CREATE TABLE half (id int); SELECT no_such_function();")},
	})
	require.NoError(t, err)
	res, err := migrate.Apply(ctx, conn, ms)
	require.ErrorContains(t, err, "0002_broken.sql")
	require.Equal(t, []string{"0001_ok.sql"}, res.Applied)

	var half bool
	require.NoError(t, conn.QueryRow(ctx, "SELECT to_regclass('half') IS NOT NULL").Scan(&half))
	require.False(t, half, "the failed migration's first statement must roll back")
	require.Equal(t, 1, db.Count(t, "schema_migrations", ""))
	// The lock was released: another runner can proceed.
	_, err = migrate.Apply(ctx, db.Connect(t), ms[:1])
	require.NoError(t, err)
}

func TestLoadRejectsBadFileNames(t *testing.T) {
	t.Parallel()
	_, err := migrate.Load(fstest.MapFS{"1_init.sql": {Data: []byte("SELECT 1")}})
	require.ErrorContains(t, err, "NNNN_lower_snake_case.sql")
	_, err = migrate.Load(fstest.MapFS{
		"0001_a.sql": {Data: []byte("SELECT 1")},
		"0001_b.sql": {Data: []byte("SELECT 1")},
	})
	require.ErrorContains(t, err, "share version 0001")
}

// The migrations that lock webhook_inbox (ACCESS EXCLUSIVE, held to the end
// of their transaction) give up when a long query holds the table, instead
// of waiting behind it while every webhook insert queues behind them: the
// deploy fails with a lock timeout and leaves nothing of the migration
// behind. Run again once the query is gone, they apply.
func TestMigrationsLockingTheInboxGiveUpOnABusyTable(t *testing.T) {
	for version, leftover := range map[string]string{
		"0005": "SELECT to_regclass('refunds') IS NOT NULL",
		"0007": "SELECT count(*) > 0 FROM information_schema.columns WHERE table_name = 'webhook_inbox' AND column_name = 'payload_raw'",
		"0012": "SELECT to_regclass('ops_audit') IS NOT NULL",
		"0011": "SELECT to_regclass('reconcile_high_water') IS NOT NULL OR count(*) > 0 FROM information_schema.columns WHERE table_name = 'webhook_inbox' AND column_name = 'source'",
	} {
		t.Run(version, func(t *testing.T) {
			t.Parallel()
			db := pgtest.Empty(t)
			ctx := context.Background()
			all, err := migrate.All()
			require.NoError(t, err)
			var before, upTo []migrate.Migration
			for _, m := range all {
				if m.Version < version {
					before = append(before, m)
				}
				if m.Version <= version {
					upTo = append(upTo, m)
				}
			}
			conn := db.Connect(t)
			_, err = migrate.Apply(ctx, conn, before)
			require.NoError(t, err)

			// A long query: its transaction holds ACCESS SHARE on the inbox.
			holder, err := db.Connect(t).Begin(ctx)
			require.NoError(t, err)
			_, err = holder.Exec(ctx, "SELECT count(*) FROM webhook_inbox")
			require.NoError(t, err)

			// Without lock_timeout it would wait for the holder: the context
			// is the test's bound, not what is asserted.
			waitCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			_, err = migrate.Apply(waitCtx, conn, upTo)
			require.ErrorContains(t, err, "SQLSTATE 55P03", "a lock timeout, not the test's deadline")
			require.Equal(t, 0, db.Count(t, "schema_migrations", "version = $1", version))
			var left bool
			require.NoError(t, conn.QueryRow(ctx, leftover).Scan(&left))
			require.False(t, left, "nothing of the migration is left")

			require.NoError(t, holder.Rollback(ctx))
			_, err = migrate.Apply(ctx, conn, upTo)
			require.NoError(t, err)
		})
	}
}

// 0010 validates the outcome check (added NOT VALID by 0005) without
// blocking the webhook: it applies while a webhook insert is in flight.
func TestValidatingTheOutcomeCheckDoesNotWaitForWebhookInserts(t *testing.T) {
	t.Parallel()
	db := pgtest.Empty(t)
	ctx := context.Background()
	conn := db.Connect(t)
	pgtest.MigrateBelow(t, conn, "0010")
	var validated bool
	require.NoError(t, conn.QueryRow(ctx, "SELECT convalidated FROM pg_constraint WHERE conname = 'webhook_inbox_outcome_check'").Scan(&validated))
	require.False(t, validated)

	insert, err := db.Connect(t).Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = insert.Rollback(ctx) }()
	_, err = insert.Exec(ctx, `INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, payload, livemode)
		VALUES ('stripe', 'billing', 'evt_1', 'invoice.paid', '{}', false)`)
	require.NoError(t, err)

	// Through 0010 (lock_timeout 5s: it would fail if it waited for the
	// insert). Later migrations that add columns take ACCESS EXCLUSIVE and
	// rightly wait for the insert (0011).
	pgtest.MigrateBelow(t, conn, "0011")
	require.NoError(t, conn.QueryRow(ctx, "SELECT convalidated FROM pg_constraint WHERE conname = 'webhook_inbox_outcome_check'").Scan(&validated))
	require.True(t, validated)
}
