package approle

import (
	"io"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/ingest"
	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/stripeevent"
	"github.com/stripe-inbox/inbox/internal/stripetest"
)

// TestIngestRoleMayOnlyStoreReceipts: the EventBridge ingest function
// stores receipts with the webhook's statement (source 'eventbridge'),
// replaces a copy the reconciler listed first, and can do nothing else.
func TestIngestRoleMayOnlyStoreReceipts(t *testing.T) {
	t.Parallel()
	d := newDeployment(t, pgtest.Empty(t))
	d.roles.Ingest = uniqueName("ingest_t")
	d.pw.Ingest = "ingest-Password-0123456789"
	d.roles.Reconcile = uniqueName("reconcile_t")
	d.pw.Reconcile = "reconcile-Password-0123456789"
	dropRoleOnCleanup(t, d.db, d.roles.Ingest)
	dropRoleOnCleanup(t, d.db, d.roles.Reconcile)
	d.deploy(t)
	conn := d.connectAs(t, d.roles.Ingest)
	requirePassword(t, d.db, d.roles.Ingest, d.pw.Ingest)

	// A listed copy first (the reconciler's role), then what the ingest
	// function does.
	listed, err := stripeevent.Parse(stripetest.Event("evt_2", "invoice.paid", stripetest.Invoice("in_2", "cus_1", "paid", 1000)))
	require.NoError(t, err)
	_, err = inbox.StoreFrom(d.ctx, d.connectAs(t, d.roles.Reconcile), inbox.SourceReconcile, "billing", listed)
	require.NoError(t, err)
	h, err := ingest.New(conn, ingest.Sources{Default: "billing"}, slog.New(slog.NewJSONHandler(io.Discard, nil)), nil)
	require.NoError(t, err)
	for i, want := range []ingest.Outcome{ingest.Stored, ingest.Duplicate} {
		res, err := h.Ingest(d.ctx, stripetest.EventBridge("eb", stripetest.EventBridgeSource, stripetest.Event("evt_1", "invoice.paid", stripetest.Invoice("in_1", "cus_1", "paid", 1000))))
		require.NoError(t, err, i)
		require.Equal(t, want, res.Outcome, i)
	}
	res, err := h.Ingest(d.ctx, stripetest.EventBridge("eb", stripetest.EventBridgeSource, listed.Payload))
	require.NoError(t, err)
	require.True(t, res.Replaced)
	require.Equal(t, 2, d.db.Count(t, "webhook_inbox", "source = 'eventbridge'"))

	requireDenied(t, conn,
		"SELECT payload FROM webhook_inbox",
		"UPDATE webhook_inbox SET processed_at = now(), outcome = 'applied'",
		"UPDATE webhook_inbox SET duplicates = duplicates + 1",
		"DELETE FROM webhook_inbox",
		`INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, payload, processed_at, outcome)
			VALUES ('stripe', 'billing', 'evt_9', 'invoice.paid', false, '{}', now(), 'applied')`,
		"SELECT 1 FROM invoices", "INSERT INTO invoices (id, customer_id, status) VALUES ('in_x', 'cus_1', 'paid')",
		"SELECT 1 FROM ledger_entries", "SELECT 1 FROM outbox", "SELECT 1 FROM anomalies",
		"SELECT 1 FROM reconcile_high_water", "SELECT 1 FROM schema_migrations",
		"CREATE TEMP TABLE scratch (id int)",
	)
	requireDenied(t, conn, ddl...)
	// A stored delivery's content cannot be rewritten (the content guard).
	_, err = conn.Exec(d.ctx, "UPDATE webhook_inbox SET payload = '{}' WHERE event_id = 'evt_1'")
	require.ErrorContains(t, err, "its content changes only when")
}
