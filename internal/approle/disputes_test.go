package approle

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/database"
	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/metrics"
	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/stripetest"
	"github.com/stripe-inbox/inbox/internal/worker"
)

// TestWorkerDisputeGrantsAreEnough: with nothing on disputes but
// workerDisputeGrants, the worker (the real one, as its role) books a
// connected account's dispute withdrawn and reinstated before the invoice
// payment that links it, and moves it to the invoice; it cannot delete a
// dispute or change an amount.
func TestWorkerDisputeGrantsAreEnough(t *testing.T) {
	t.Parallel()
	d := newDeployment(t, pgtest.Empty(t))
	d.deploy(t)
	worker_ := pgx.Identifier{d.roles.Worker}.Sanitize()
	_, err := d.db.Pool.Exec(d.ctx, "REVOKE ALL ON public.disputes FROM "+worker_)
	require.NoError(t, err)
	for _, g := range workerDisputeGrants(worker_) {
		_, err := d.db.Pool.Exec(d.ctx, g)
		require.NoError(t, err, g)
	}

	webhook := d.connectAs(t, d.roles.Webhook)
	bts := []map[string]any{
		stripetest.DisputeBalanceTransaction("txn_w", -800, 1500, "usd"), stripetest.DisputeBalanceTransaction("txn_r", 800, 0, "usd"),
	}
	paid := stripetest.Invoice("in_d", "cus_1", "paid", 800)
	paid["charge"] = "ch_d"
	for i, e := range []struct {
		typ    string
		object map[string]any
	}{
		{"charge.dispute.funds_withdrawn", stripetest.Dispute("dp_d", "ch_d", "", "needs_response", 800, bts[0])},
		{"charge.dispute.funds_reinstated", stripetest.Dispute("dp_d", "ch_d", "", "won", 800, bts...)},
		{"invoice.paid", paid},
	} {
		id := "evt_d" + string(rune('0'+i))
		receive(t, webhook, stripetest.EventWith(id, e.typ, stripetest.Meta{Created: stripetest.Created, Account: "acct_d"}, e.object))
		// One at a time, in this order: the link comes last.
		pool, err := database.Open(d.ctx, database.Config{URL: d.dsnAs(t, d.roles.Worker), MaxConns: 2, PreparedStatements: true}, nil)
		require.NoError(t, err)
		cfg := worker.Config{Mode: worker.ModeTest, Concurrency: 1, StatementTimeout: time.Second, DeadlineMargin: 6 * time.Second, Lease: time.Minute}
		w, err := worker.New(pool, handlers.Default(), cfg, slog.New(slog.NewJSONHandler(io.Discard, nil)), metrics.New(io.Discard, "Test", nil))
		require.NoError(t, err)
		_, err = w.Run(d.ctx)
		pool.Close()
		require.NoError(t, err)
		var lastError *string
		require.NoError(t, d.db.Pool.QueryRow(d.ctx, "SELECT last_error FROM webhook_inbox WHERE event_id = $1 AND processed_at IS NOT NULL", id).Scan(&lastError))
		require.Nil(t, lastError, e.typ)
	}
	rows, err := d.db.Pool.Query(d.ctx, "SELECT account || ' ' || invoice_id || ' ' || kind || ' ' || amount FROM ledger_entries ORDER BY kind")
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{
		"acct_d in_d dispute_funds_reinstated:dp_d 800", "acct_d in_d dispute_funds_withdrawn:dp_d -800", "acct_d in_d payment 800",
	}, got)

	requireDenied(t, d.connectAs(t, d.roles.Worker), "DELETE FROM disputes", "UPDATE disputes SET amount = 0", "TRUNCATE disputes")
}
