package worker

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/pgtest"
)

// TestPipelinedTx: the transaction a batch opens with BEGIN in its first
// pipeline commits what fn did when fn returns nil; rolls it back when fn
// fails, or when the transaction failed under fn (COMMIT answered
// ROLLBACK); reports a function that opened none; never joins a
// transaction left open on the connection; and
// leaves the connection idle and usable each time.
func TestPipelinedTx(t *testing.T) {
	ctx := context.Background()
	db := pgtest.DB(t)
	conn := db.Connect(t)
	_, err := conn.Exec(ctx, "CREATE TABLE pipelined (v text PRIMARY KEY)")
	require.NoError(t, err)
	insert := func(v string) func(txConn) error {
		return func(tx txConn) error {
			// As inbox.BeginLockMany: BEGIN and the first statement in one pipeline.
			b := &pgx.Batch{}
			b.Queue("BEGIN")
			b.Queue("INSERT INTO pipelined VALUES ($1)", v)
			return tx.SendBatch(ctx, b).Close()
		}
	}
	values := func() []string {
		rows, err := conn.Query(ctx, "SELECT v FROM pipelined ORDER BY v")
		require.NoError(t, err)
		vs, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return vs
	}

	require.NoError(t, inPipelinedTx(ctx, conn, insert("committed")))
	require.Equal(t, byte('I'), conn.PgConn().TxStatus())

	boom := errors.New("boom")
	err = inPipelinedTx(ctx, conn, func(tx txConn) error {
		require.NoError(t, insert("failed")(tx))
		return boom
	})
	require.ErrorIs(t, err, boom)
	require.Equal(t, byte('I'), conn.PgConn().TxStatus())

	err = inPipelinedTx(ctx, conn, func(tx txConn) error {
		require.NoError(t, insert("aborted")(tx))
		_, err := tx.Exec(ctx, "INSERT INTO pipelined VALUES ('committed')") // a duplicate: the transaction fails
		require.Error(t, err)
		return nil // swallowed: COMMIT answers ROLLBACK
	})
	require.ErrorIs(t, err, pgx.ErrTxCommitRollback)
	require.Equal(t, byte('I'), conn.PgConn().TxStatus())

	// A function that opened no transaction is not reported committed.
	err = inPipelinedTx(ctx, conn, func(tx txConn) error { return nil })
	require.ErrorContains(t, err, "no transaction is open")

	_, err = conn.Exec(ctx, "BEGIN")
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "INSERT INTO pipelined VALUES ('left open')")
	require.NoError(t, err)
	require.NoError(t, inPipelinedTx(ctx, conn, insert("after")))
	require.Equal(t, byte('I'), conn.PgConn().TxStatus())

	require.Equal(t, []string{"after", "committed"}, values())
}
