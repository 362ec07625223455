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
	require.Equal(t, 2, d.db.Count(t, "webhook_inbox", "source = 'reconcile'"))

	requireDenied(t, conn,
		"SELECT payload FROM webhook_inbox",
		"UPDATE webhook_inbox SET processed_at = now(), outcome = 'applied'",
		"UPDATE webhook_inbox SET source = 'webhook'",
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

func TestLoadConfigReconcileRole(t *testing.T) {
	t.Parallel()
	base := map[string]string{
		"DATABASE_URL": "postgres://master@127.0.0.1/inbox", "SCHEMA_OWNER_ROLE": "inbox_schema_owner",
		"WEBHOOK_DB_USER": "inbox_webhook", "WORKER_DB_USER": "inbox_worker", "PURGE_DB_USER": "inbox_purge",
		"WEBHOOK_DB_PASSWORD": password1, "WORKER_DB_PASSWORD": password1, "PURGE_DB_PASSWORD": password1,
	}
	env := func(extra map[string]string) func(string) string {
		return func(k string) string {
			if v, ok := extra[k]; ok {
				return v
			}
			return base[k]
		}
	}
	c, err := LoadConfig(env(map[string]string{"RECONCILE_DB_USER": "inbox_reconcile", "RECONCILE_DB_PASSWORD": password2}))
	require.NoError(t, err)
	require.Equal(t, "inbox_reconcile", c.Roles.Reconcile)
	require.Equal(t, password2, c.Passwords.Reconcile)

	_, err = LoadConfig(env(map[string]string{"RECONCILE_DB_USER": "inbox_reconcile"}))
	require.ErrorContains(t, err, "no password for the reconcile's role: set RECONCILE_DB_SECRET_ARN")
	_, err = LoadConfig(env(map[string]string{"RECONCILE_DB_PASSWORD": password2}))
	require.ErrorContains(t, err, "RECONCILE_DB_PASSWORD is set but RECONCILE_DB_USER is not")
	_, err = LoadConfig(env(map[string]string{"RECONCILE_DB_USER": "inbox_webhook", "RECONCILE_DB_PASSWORD": password2}))
	require.ErrorContains(t, err, "each needs a role of its own")
}
