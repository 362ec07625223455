package worker_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/database"
	"github.com/stripe-inbox/inbox/internal/migrate"
	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/stripetest"
	"github.com/stripe-inbox/inbox/internal/worker"
)

// A connected account's invoice paid, refunded and linked before migration
// 0017 (its rows without an account) gets its account back from the
// receipts still kept, so the account's later events find its rows: a
// second Event object of the payment books nothing, the refund is not
// booked again, and a dispute of the charge lands under the invoice, all
// under the account.
func TestConnectedAccountRowsBookedBeforeTheUpgradeKeepTheirKeys(t *testing.T) {
	t.Parallel()
	db := pgtest.Empty(t)
	ctx := context.Background()
	conn := db.Connect(t)
	pgtest.MigrateBelow(t, conn, "0017")
	// What the code before 0017 left for acct_A's events evt_old1 (the
	// payment) and evt_old2 (the refund).
	_, err := conn.Exec(ctx, `
INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, payload, account, object_id, processed_at, outcome)
VALUES ('stripe', 'billing', 'evt_old1', 'invoice.paid', false, '{}', 'acct_A', 'in_1', now(), 'applied'),
       ('stripe', 'billing', 'evt_old2', 'refund.updated', false, '{}', 'acct_A', 're_1', now(), 'applied');
INSERT INTO invoices (id, customer_id, status, currency, amount_due, amount_paid, paid_at) VALUES ('in_1', 'cus_1', 'paid', 'usd', 1000, 1000, now());
INSERT INTO ledger_entries (invoice_id, kind, amount, currency, event_id)
VALUES ('in_1', 'payment', 1000, 'usd', 'evt_old1'), ('in_1', 'refund:re_1', -300, 'usd', 'evt_old2');
INSERT INTO refunds (id, charge_id, invoice_id, amount, currency, status, succeeded) VALUES ('re_1', 'ch_1', 'in_1', 300, 'usd', 'succeeded', true);
INSERT INTO payment_links (payment_id, invoice_id, has_refunds) VALUES ('ch_1', 'in_1', true);`)
	require.NoError(t, err)
	_, err = migrate.Up(ctx, conn)
	require.NoError(t, err)
	pool, err := database.Open(ctx, database.Config{URL: db.URL, MaxConns: 4, PreparedStatements: true}, nil)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	b := &testBundle{db: db, pool: pool, metrics: &bytes.Buffer{}, batchSize: testBatchSize(t)}

	w := b.newWorker(t, nil, worker.Config{Concurrency: 1})
	paid := stripetest.Invoice("in_1", "cus_1", "paid", 1000)
	paid["charge"] = "ch_1"
	acct := stripetest.Meta{Created: stripetest.Created, Account: "acct_A"}
	for _, ev := range [][]byte{
		stripetest.EventWith("evt_new1", "invoice.paid", acct, paid),
		stripetest.EventWith("evt_new2", "refund.updated", acct, stripetest.RefundIn("re_1", "ch_1", "succeeded", 300)),
		stripetest.EventWith("evt_new3", "charge.dispute.funds_withdrawn", acct, stripetest.Dispute("dp_1", "ch_1", "", "needs_response", 1000)),
	} {
		b.receive(t, ev)
		b.run(t, w)
	}
	rows, err := pool.Query(ctx, "SELECT coalesce(account, '-') || ' ' || invoice_id || ' ' || kind || ' ' || amount FROM ledger_entries ORDER BY kind")
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"acct_A in_1 dispute_funds_withdrawn:dp_1 -1000", "acct_A in_1 payment 1000", "acct_A in_1 refund:re_1 -300"}, got)
	require.Equal(t, 1, db.Count(t, "invoices", "account = 'acct_A'"))
	require.Equal(t, 0, db.Count(t, "invoices", "account IS NULL"))
	require.Equal(t, 1, db.Count(t, "refunds", "account = 'acct_A'"))
	require.Equal(t, 1, db.Count(t, "payment_links", "account = 'acct_A'"))
}
