package worker

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/pgtest"
)

// TestPipelinedTx: the transaction a batch opens with BEGIN in its first
// pipeline and commits with COMMIT in its last holds what fn did when fn
// committed it; is rolled back when fn fails, or returns without its
// commit; never joins a transaction left open on the connection; and
// leaves the connection idle and usable each time.
func TestPipelinedTx(t *testing.T) {
	ctx := context.Background()
	db := pgtest.DB(t)
	conn := db.Connect(t)
	_, err := conn.Exec(ctx, "CREATE TABLE pipelined (v text PRIMARY KEY)")
	require.NoError(t, err)
	// As inbox.BeginLockMany and inbox.MarkManyProcessedCommit: BEGIN with
	// the first statement, COMMIT with the last.
	insert := func(tx txConn, v string, commit bool) {
		b := &pgx.Batch{}
		b.Queue("BEGIN")
		b.Queue("INSERT INTO pipelined VALUES ($1)", v)
		if commit {
			b.Queue("COMMIT")
		}
		require.NoError(t, tx.SendBatch(ctx, b).Close())
	}
	values := func() []string {
		rows, err := conn.Query(ctx, "SELECT v FROM pipelined ORDER BY v")
		require.NoError(t, err)
		vs, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return vs
	}

	require.NoError(t, inPipelinedTx(ctx, conn, func(tx txConn) (bool, error) {
		insert(tx, "committed", true)
		return true, nil
	}))
	require.Equal(t, byte('I'), conn.PgConn().TxStatus())

	boom := errors.New("boom")
	err = inPipelinedTx(ctx, conn, func(tx txConn) (bool, error) {
		insert(tx, "failed", false)
		return false, boom
	})
	require.ErrorIs(t, err, boom)
	require.Equal(t, byte('I'), conn.PgConn().TxStatus())

	err = inPipelinedTx(ctx, conn, func(tx txConn) (bool, error) {
		insert(tx, "uncommitted", false)
		return false, nil
	})
	require.ErrorContains(t, err, "without its commit")
	require.Equal(t, byte('I'), conn.PgConn().TxStatus())

	_, err = conn.Exec(ctx, "BEGIN")
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "INSERT INTO pipelined VALUES ('left open')")
	require.NoError(t, err)
	require.NoError(t, inPipelinedTx(ctx, conn, func(tx txConn) (bool, error) {
		insert(tx, "after", true)
		return true, nil
	}))
	require.Equal(t, byte('I'), conn.PgConn().TxStatus())

	require.Equal(t, []string{"after", "committed"}, values())
}

// TestLockedOnce: a batch marks only receipts its lock returned, each
// once; anything else is refused before the mark and its COMMIT are sent.
func TestLockedOnce(t *testing.T) {
	a, b := inbox.Key{Provider: "stripe", Endpoint: "billing", EventID: "evt_a"}, inbox.Key{Provider: "stripe", Endpoint: "billing", EventID: "evt_b"}
	locked := map[inbox.Key]inbox.Locked{a: {}, b: {}}
	require.NoError(t, lockedOnce([]inbox.Key{a, b}, locked))
	require.NoError(t, lockedOnce(nil, locked))
	require.ErrorContains(t, lockedOnce([]inbox.Key{a, a}, locked), "evt_a")
	require.ErrorContains(t, lockedOnce([]inbox.Key{{Provider: "stripe", Endpoint: "billing", EventID: "evt_c"}}, locked), "evt_c")
}
