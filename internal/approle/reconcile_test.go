package approle

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/reconcile"
	"github.com/stripe-inbox/inbox/internal/stripetest"
)

// TestReconcileRoleMayOnlyStoreReceiptsAndItsMark: the reconciler's store
// function stores listed events (internal/reconcile.DBSink, the webhook's
// INSERT with source 'reconcile') and keeps its high-water mark, and can do
// nothing else: no payloads read, no receipts changed, no business tables.
func TestReconcileRoleMayOnlyStoreReceiptsAndItsMark(t *testing.T) {
	t.Parallel()
	d := newDeployment(t, pgtest.Empty(t))
	d.roles.Reconcile = uniqueName("reconcile_t")
	d.pw.Reconcile = "reconcile-Password-0123456789"
	dropRoleOnCleanup(t, d.db, d.roles.Reconcile)
	d.deploy(t)
	conn := d.connectAs(t, d.roles.Reconcile)
	requirePassword(t, d.db, d.roles.Reconcile, d.pw.Reconcile)

	// What the store function does.
	sink := reconcile.DBSink{DB: conn}
	page := []json.RawMessage{
		stripetest.Event("evt_1", "invoice.paid", stripetest.Invoice("in_1", "cus_1", "paid", 1000)),
		stripetest.Event("evt_2", "invoice.created", stripetest.Invoice("in_2", "cus_1", "draft", 1000)),
	}
	c, err := sink.StorePage(d.ctx, "billing", page)
	require.NoError(t, err)
	require.Equal(t, 2, c.Stored)
	c, err = sink.StorePage(d.ctx, "billing", page)
	require.NoError(t, err)
	require.Equal(t, 2, c.AlreadyPresent)
	mark := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	require.NoError(t, sink.Advance(d.ctx, "billing", mark))
	require.NoError(t, sink.Advance(d.ctx, "billing", mark.Add(time.Hour)))
	hw, ok, err := sink.HighWater(d.ctx, "billing")
	require.NoError(t, err)
	require.True(t, ok)
	require.True(t, hw.Equal(mark.Add(time.Hour)))
	require.Equal(t, 2, d.db.Count(t, "webhook_inbox", "source = 'reconcile' AND listed_first"))

	requireDenied(t, conn,
		"SELECT payload FROM webhook_inbox",
		"UPDATE webhook_inbox SET processed_at = now(), outcome = 'applied'",
		"UPDATE webhook_inbox SET source = 'webhook'",
		"UPDATE webhook_inbox SET payload = '{}'",
		"SELECT listed_first FROM webhook_inbox",
		"DELETE FROM webhook_inbox",
		"DELETE FROM reconcile_high_water",
		`INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, payload, processed_at, outcome)
			VALUES ('stripe', 'billing', 'evt_9', 'invoice.paid', false, '{}', now(), 'applied')`,
		"SELECT 1 FROM invoices", "INSERT INTO invoices (id, customer_id, status) VALUES ('in_x', 'cus_1', 'paid')",
		"SELECT 1 FROM ledger_entries", "SELECT 1 FROM outbox", "SELECT 1 FROM anomalies",
		"SELECT 1 FROM schema_migrations",
		"CREATE TEMP TABLE scratch (id int)",
	)
	requireDenied(t, conn, ddl...)

	// The webhook's role has nothing on the mark.
	requireDenied(t, d.connectAs(t, d.roles.Webhook), "SELECT 1 FROM reconcile_high_water",
		"INSERT INTO reconcile_high_water (provider, endpoint, high_water) VALUES ('stripe', 'x', now())")
}
