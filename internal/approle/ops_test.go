package approle

import (
	"io"
	"log/slog"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/ops"
	"github.com/stripe-inbox/inbox/internal/ops/opstest"
	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/stripetest"
)

// TestOpsRoleMayOnlyOperate: the ops function's role runs every inboxctl
// command and nothing else: it cannot store, process, delete or scrub
// receipts, book money, or change the audit trail; and no function's role
// can change the audit trail either.
func TestOpsRoleMayOnlyOperate(t *testing.T) {
	t.Parallel()
	d := newDeployment(t, pgtest.Empty(t))
	d.roles.Ops = uniqueName("ops_t")
	d.pw.Ops = "ops-Password-0123456789"
	dropRoleOnCleanup(t, d.db, d.roles.Ops)
	sum := d.deploy(t)
	require.Contains(t, sum.Roles.Users, UserResult{Role: d.roles.Ops, Created: true})
	requirePassword(t, d.db, d.roles.Ops, d.pw.Ops)
	fx := opstest.Seed(t, d.db)
	var parked int64
	require.NoError(t, d.db.Pool.QueryRow(d.ctx, `
INSERT INTO writeback_intents (kind, target, params, idempotency_key, event_id, status, refused, attempts, last_error)
VALUES ('customer_metadata', 'cus_x', '{"metadata": {"k": "v"}}', 'inbox:customer_metadata:in_x:payment', 'evt_x', 'parked', true, 1, '404')
RETURNING id`).Scan(&parked))

	pool, err := pgxpool.New(d.ctx, d.dsnAs(t, d.roles.Ops))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	o, err := ops.New(pool, ops.Config{MaxAttempts: opstest.MaxAttempts}, slog.New(slog.NewJSONHandler(io.Discard, nil)))
	require.NoError(t, err)
	c := ops.Caller{Actor: "test", RequestID: "req-1"}
	for _, r := range []ops.Request{
		{Command: ops.CmdStatus},
		{Command: ops.CmdReceipts, Filter: ops.Filter{State: "failed"}},
		{Command: ops.CmdShow, EventID: opstest.Paid, Payload: true, Reason: "ticket 1"},
		{Command: ops.CmdShow, EventID: opstest.PaidOnVoid},
		{Command: ops.CmdRetry, Filter: ops.Filter{State: "needs-review"}, DryRun: true, Reason: "check"},
		{Command: ops.CmdRetry, Filter: ops.Filter{State: "needs-review"}, Reason: "fixed"},
		{Command: ops.CmdAnomalies, All: true},
		{Command: ops.CmdResolve, AnomalyID: fx.AnomalyID, Note: "refunded"},
		{Command: ops.CmdSecrets},
		{Command: ops.CmdOutbox, AllUnpublished: true},
		{Command: ops.CmdOutboxRetry, Waiting: true, DryRun: true, Reason: "check"},
		{Command: ops.CmdOutboxRetry, OutboxIDs: fx.OutboxWaiting[:1], Reason: "rule fixed"},
		{Command: ops.CmdOutboxRetry, Waiting: true, Reason: "bus policy fixed"},
		{Command: ops.CmdWritebacks},
		{Command: ops.CmdWriteback, WritebackID: parked},
		{Command: ops.CmdWritebackRetry, WritebackID: parked, DryRun: true, Reason: "check"},
		{Command: ops.CmdWritebackRetry, WritebackID: parked, Reason: "customer restored"},
	} {
		_, err := o.Do(d.ctx, r, c)
		require.NoError(t, err, r.Command)
	}
	// retry, resolve, two outbox-retries, a writeback-retry, and the read of a payload.
	require.Equal(t, 6, d.db.Count(t, "ops_audit", "request_id = 'req-1'"))
	require.Equal(t, 1, d.db.Count(t, "writeback_intents", "id = $1 AND status = 'pending' AND key_generation = 1", parked), "writeback-retry, as inbox_ops")
	require.Equal(t, 2, d.db.Count(t, "outbox", "attempts = 0 AND last_error = $1", opstest.OutboxError), "outbox-retry, as inbox_ops")
	require.Equal(t, 1, d.db.Count(t, "outbox", "id = $1 AND published_at IS NOT NULL AND attempts = 10", fx.OutboxPublished))

	conn := d.connectAs(t, d.roles.Ops)
	requireDenied(t, conn,
		`INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, payload) VALUES ('stripe', 'billing', 'evt_x', 'x', false, '{}')`,
		"DELETE FROM webhook_inbox",
		"UPDATE webhook_inbox SET processed_at = now(), outcome = 'applied'",
		"UPDATE webhook_inbox SET payload = '{}'",
		"UPDATE webhook_inbox SET last_error = NULL",
		"UPDATE invoices SET amount_paid = 0", "DELETE FROM invoices",
		"INSERT INTO ledger_entries (invoice_id, kind, amount, event_id) VALUES ('in_x', 'payment', 1, 'evt_x')",
		"UPDATE ledger_entries SET amount = 0",
		"INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('a', 'b', 'c', '{}')",
		"UPDATE outbox SET published_at = now()",
		"UPDATE outbox SET published_at = NULL",
		"UPDATE outbox SET payload = '{}'",
		"UPDATE outbox SET event_type = 'x'",
		"UPDATE outbox SET last_error = NULL",
		"DELETE FROM outbox",
		"DELETE FROM anomalies", "UPDATE anomalies SET kind = 'x'",
		"UPDATE ops_audit SET reason = 'x'", "DELETE FROM ops_audit",
		"SELECT 1 FROM refunds", "SELECT 1 FROM schema_migrations",
		"CREATE TEMP TABLE scratch (id int)",
	)
	requireDenied(t, conn, ddl...)
	for _, role := range []string{d.roles.Webhook, d.roles.Worker, d.roles.Purge} {
		requireDenied(t, d.connectAs(t, role),
			"INSERT INTO ops_audit (action, filter, affected, reason, actor) VALUES ('retry', '{}', 0, 'x', 'x')",
			"UPDATE ops_audit SET reason = 'x'", "DELETE FROM ops_audit")
	}
}

// TestWebhookRoleCountsDuplicatesAndNothingMore: the webhook's role can
// count a duplicate delivery on its receipt (inbox.CountDuplicate: its row
// locked FOR UPDATE SKIP LOCKED, one column updated) and change no other
// column.
func TestWebhookRoleCountsDuplicatesAndNothingMore(t *testing.T) {
	t.Parallel()
	d := newDeployment(t, pgtest.Empty(t))
	d.deploy(t)
	webhook := d.connectAs(t, d.roles.Webhook)
	payload := stripetest.Event("evt_dup", "invoice.paid", stripetest.Invoice("in_1", "cus_1", "paid", 100))
	require.Equal(t, inbox.Stored, receive(t, webhook, payload))
	require.Equal(t, inbox.Duplicate, receive(t, webhook, payload))
	counted, err := inbox.CountDuplicate(d.ctx, webhook, "billing", "evt_dup")
	require.NoError(t, err)
	require.True(t, counted)
	require.Equal(t, 1, d.db.Count(t, "webhook_inbox", "event_id = 'evt_dup' AND duplicates = 1"))
	requireDenied(t, webhook,
		"UPDATE webhook_inbox SET attempts = 0",
		"UPDATE webhook_inbox SET secret_fingerprint = 'x'",
		"SELECT secret_fingerprint FROM webhook_inbox",
		"SELECT payload FROM webhook_inbox")
}
