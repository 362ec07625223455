package approle

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/migrate"
	"github.com/stripe-inbox/inbox/internal/pgtest"
)

func TestDeployerMigratesThenEnsuresRole(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := pgtest.Empty(t)
	role := uniqueName("inbox_app_t")
	dropRoleOnCleanup(t, db, role)

	d := &Deployer{
		Connect:     func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, db.URL) },
		AppPassword: func(context.Context) (string, error) { return password1, nil },
		AppUser:     role,
		Logger:      slog.New(slog.NewJSONHandler(io.Discard, nil)),
	}
	all, err := migrate.All()
	require.NoError(t, err)

	sum, err := d.Run(ctx)
	require.NoError(t, err)
	require.Len(t, sum.Applied, len(all))
	require.Equal(t, all[len(all)-1].Version, sum.Current)
	require.True(t, sum.AppRole.Created)

	// A second deploy applies nothing and keeps the role.
	sum, err = d.Run(ctx)
	require.NoError(t, err)
	require.Empty(t, sum.Applied)
	require.NotNil(t, sum.Applied, "applied must marshal as [] in the summary")
	require.False(t, sum.AppRole.Created)
}

func TestDeployerRetriesTheFirstConnection(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := pgtest.DB(t)
	role := uniqueName("inbox_app_t")
	dropRoleOnCleanup(t, db, role)

	attempts := 0
	d := &Deployer{
		Connect: func(ctx context.Context) (*pgx.Conn, error) {
			attempts++
			if attempts < 3 {
				return nil, errors.New("proxy target not available yet")
			}
			return pgx.Connect(ctx, db.URL)
		},
		AppPassword: func(context.Context) (string, error) { return password1, nil },
		AppUser:     role,
		ConnectWait: 10 * time.Second,
		RetryEvery:  10 * time.Millisecond,
		Logger:      slog.New(slog.NewJSONHandler(io.Discard, nil)),
	}
	_, err := d.Run(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, attempts)
}

func TestDeployerGivesUpAfterConnectWait(t *testing.T) {
	t.Parallel()
	d := &Deployer{
		Connect:     func(context.Context) (*pgx.Conn, error) { return nil, errors.New("refused") },
		AppPassword: func(context.Context) (string, error) { return password1, nil },
		AppUser:     "inbox_app",
		ConnectWait: 50 * time.Millisecond,
		RetryEvery:  10 * time.Millisecond,
		Logger:      slog.New(slog.NewJSONHandler(io.Discard, nil)),
	}
	_, err := d.Run(context.Background())
	require.ErrorContains(t, err, "refused")
	require.ErrorContains(t, err, "attempts")
}

func TestDeployerFailsWithoutPassword(t *testing.T) {
	t.Parallel()
	d := &Deployer{
		Connect:     func(context.Context) (*pgx.Conn, error) { t.Fatal("must not connect"); return nil, nil },
		AppPassword: func(context.Context) (string, error) { return "", errors.New("AccessDenied") },
		AppUser:     "inbox_app",
		Logger:      slog.New(slog.NewJSONHandler(io.Discard, nil)),
	}
	_, err := d.Run(context.Background())
	require.ErrorContains(t, err, "AccessDenied")
}
