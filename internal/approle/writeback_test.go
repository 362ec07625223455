package approle

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/writeback"
)

// TestWritebackRoleMayOnlyClaimAndRecordIntents: the write-back store
// function (internal/writeback.DBStore) claims intents, records each kind
// of outcome and reads the backlog as inbox_writeback, and can do nothing
// else: no intent inserted or deleted, none of what an intent asks for
// changed, no receipt, no business table.
func TestWritebackRoleMayOnlyClaimAndRecordIntents(t *testing.T) {
	t.Parallel()
	d := newDeployment(t, pgtest.Empty(t))
	d.roles.Writeback = uniqueName("writeback_t")
	d.pw.Writeback = "writeback-Password-0123456789"
	dropRoleOnCleanup(t, d.db, d.roles.Writeback)
	sum := d.deploy(t)
	require.Contains(t, sum.Roles.Users, UserResult{Role: d.roles.Writeback, Created: true})
	requirePassword(t, d.db, d.roles.Writeback, d.pw.Writeback)
	conn := d.connectAs(t, d.roles.Writeback)

	// Four intents, as the worker records them (here as the master).
	for _, in := range []string{"in_1", "in_2", "in_3", "in_4"} {
		_, err := d.db.Pool.Exec(d.ctx, `
INSERT INTO writeback_intents (kind, target, params, idempotency_key, event_id)
VALUES ('customer_metadata', 'cus_`+in+`', '{"metadata": {"k": "v"}}', 'inbox:customer_metadata:`+in+`:payment', 'evt_`+in+`')`)
		require.NoError(t, err)
	}

	// What the store function does, as its role.
	store := writeback.DBStore{DB: conn}
	b, err := store.Backlog(d.ctx)
	require.NoError(t, err)
	require.Equal(t, 4, b.Pending)
	token, intents, err := store.Claim(d.ctx, 10, time.Minute, writeback.KeyLifetime)
	require.NoError(t, err)
	require.Len(t, intents, 4)
	require.Equal(t, 1, intents[0].Attempts)
	n, err := store.Record(d.ctx, token, 5, []writeback.Outcome{
		{ID: intents[0].ID, Kind: writeback.Done, Via: writeback.ViaCall, ResultID: intents[0].Target, Result: json.RawMessage(`{"id":"cus_in_1","object":"customer"}`)},
		{ID: intents[1].ID, Kind: writeback.Retry, Error: "no answer", Delay: time.Millisecond},
		{ID: intents[2].ID, Kind: writeback.Release, Error: "throttled", Delay: time.Millisecond},
		{ID: intents[3].ID, Kind: writeback.Park, Error: "404: no such customer"},
	})
	require.NoError(t, err)
	require.Equal(t, 4, n)
	require.Equal(t, 1, d.db.Count(t, "writeback_intents", "status = 'done' AND result_via = 'call' AND result_id = 'cus_in_1'"))
	require.Equal(t, 2, d.db.Count(t, "writeback_intents", "status = 'pending' AND claim_token IS NULL"))
	require.Equal(t, 1, d.db.Count(t, "writeback_intents", "status = 'parked' AND refused"))
	b, err = store.Backlog(d.ctx)
	require.NoError(t, err)
	require.Equal(t, 2, b.Pending)
	require.Equal(t, 1, b.Parked)

	requireDenied(t, conn,
		`INSERT INTO writeback_intents (kind, target, params, idempotency_key, event_id)
			VALUES ('customer_metadata', 'cus_x', '{"metadata": {"k": "v"}}', 'inbox:customer_metadata:in_x:payment', 'evt_x')`,
		"DELETE FROM writeback_intents",
		"SELECT event_id FROM writeback_intents",
		"SELECT result FROM writeback_intents",
		"SELECT last_error FROM writeback_intents",
		"UPDATE writeback_intents SET params = '{\"metadata\": {\"k\": \"other\"}}'",
		"UPDATE writeback_intents SET target = 'cus_other'",
		"UPDATE writeback_intents SET idempotency_key = 'other'",
		"UPDATE writeback_intents SET key_generation = key_generation + 1",
		"UPDATE writeback_intents SET event_id = 'evt_other'",
		"SELECT 1 FROM webhook_inbox", "SELECT 1 FROM invoices", "SELECT 1 FROM ledger_entries",
		"SELECT 1 FROM outbox", "SELECT 1 FROM anomalies", "SELECT 1 FROM ops_audit",
		"SELECT 1 FROM reconcile_high_water", "SELECT 1 FROM schema_migrations",
		"CREATE TEMP TABLE scratch (id int)",
	)
	requireDenied(t, conn, ddl...)
	// An operator's retry of a parked intent is inbox_ops's, not the
	// sender's (it moves the key generation).
	_, err = writeback.RetryParked(d.ctx, conn, intents[3].ID)
	requireSQLState(t, err, "42501")
}
