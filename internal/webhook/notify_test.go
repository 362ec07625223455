package webhook_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/database"
	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/secrets"
	"github.com/stripe-inbox/inbox/internal/webhook"
)

// TestNotifyWakesListenersOnStoreOnly: with Notify, a stored receipt sends
// one notification on inbox.NotifyChannel when it commits; a duplicate
// sends none.
func TestNotifyWakesListenersOnStoreOnly(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	keyring, err := secrets.NewKeyring(context.Background(), map[string]string{"billing": secretA}, secrets.Literal, secrets.Options{})
	require.NoError(t, err)
	pool, err := database.Open(context.Background(), database.Config{URL: db.URL, MaxConns: 2}, nil)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	h, err := webhook.New(pool, keyring, webhook.Config{Notify: true}, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	require.NoError(t, err)
	b := &testBundle{db: db, handler: h}

	listener := db.Connect(t)
	require.NoError(t, inbox.Listen(context.Background(), listener))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	req := signedRequest("billing", "evt_1", "invoice.paid", secretA)
	require.Equal(t, "stored", outcomeOf(t, b.do(t, req)))
	n, err := listener.WaitForNotification(ctx)
	require.NoError(t, err)
	require.Equal(t, inbox.NotifyChannel, n.Channel)

	require.Equal(t, "duplicate", outcomeOf(t, b.do(t, req)))
	// A second stored receipt: the next notification is its, so the
	// duplicate sent none.
	require.Equal(t, "stored", outcomeOf(t, b.do(t, signedRequest("billing", "evt_2", "invoice.paid", secretA))))
	_, err = listener.WaitForNotification(ctx)
	require.NoError(t, err)
	var pending int
	require.NoError(t, listener.QueryRow(ctx, "SELECT 1").Scan(&pending)) // reads anything pending
	short, cancelShort := context.WithTimeout(ctx, 0)
	defer cancelShort()
	_, err = listener.WaitForNotification(short)
	require.Error(t, err, "no third notification (the duplicate sent none)")
	require.Equal(t, 2, db.Count(t, "webhook_inbox", ""))
}
