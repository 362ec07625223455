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

	"github.com/stripe-inbox/inbox/internal/pgtest"
)

func TestDeployerRetriesTheFirstConnection(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dep := newDeployment(t, pgtest.Empty(t))

	attempts := 0
	d := dep.deployer(t)
	connect := d.Connect
	d.Connect = func(ctx context.Context) (*pgx.Conn, error) {
		attempts++
		if attempts < 3 {
			return nil, errors.New("proxy target not available yet")
		}
		return connect(ctx)
	}
	d.ConnectWait = 10 * time.Second
	d.RetryEvery = 10 * time.Millisecond
	_, err := d.Run(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, attempts)
}

func TestDeployerGivesUpAfterConnectWait(t *testing.T) {
	t.Parallel()
	d := &Deployer{
		Connect:     func(context.Context) (*pgx.Conn, error) { return nil, errors.New("refused") },
		Passwords:   func(context.Context) (Passwords, error) { return Passwords{}, nil },
		Roles:       Roles{Owner: "inbox_schema_owner", Webhook: "inbox_webhook", Worker: "inbox_worker", Purge: "inbox_purge"},
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
		Connect:   func(context.Context) (*pgx.Conn, error) { t.Fatal("must not connect"); return nil, nil },
		Passwords: func(context.Context) (Passwords, error) { return Passwords{}, errors.New("AccessDenied") },
		Roles:     Roles{Owner: "inbox_schema_owner", Webhook: "inbox_webhook", Worker: "inbox_worker", Purge: "inbox_purge"},
		Logger:    slog.New(slog.NewJSONHandler(io.Discard, nil)),
	}
	_, err := d.Run(context.Background())
	require.ErrorContains(t, err, "AccessDenied")
}
