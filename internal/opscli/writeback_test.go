package opscli_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/ops/opstest"
	"github.com/stripe-inbox/inbox/internal/opscli"
)

// The write-backs waiting for a human: listed, shown with attempts and the
// error, retried (dry run first, a reason required, audited); a done or
// pending one is not retried.
func TestWritebackCommandsLocally(t *testing.T) {
	t.Parallel()
	fx, env := setup(t)
	ctx := context.Background()
	var parked, done int64
	require.NoError(t, fx.DB.Pool.QueryRow(ctx, `
INSERT INTO writeback_intents (kind, target, params, idempotency_key, event_id, status, refused, attempts, first_attempt_at, last_attempt_at, last_error)
VALUES ('customer_metadata', 'cus_gone', '{"metadata": {"inbox_last_paid_invoice": "in_9"}}', 'inbox:customer_metadata:in_9:payment', 'evt_9',
        'parked', true, 1, now() - interval '2 hours', now() - interval '2 hours', 'POST /v1/customers/cus_gone: 404: No such customer: ''cus_gone''')
RETURNING id`).Scan(&parked))
	require.NoError(t, fx.DB.Pool.QueryRow(ctx, `
INSERT INTO writeback_intents (kind, target, params, idempotency_key, event_id, status, attempts, first_attempt_at, result_id, result, result_via, done_at)
VALUES ('customer_metadata', 'cus_1', '{"metadata": {"inbox_last_paid_invoice": "in_8"}}', 'inbox:customer_metadata:in_8:payment', 'evt_8',
        'done', 1, now(), 'cus_1', '{"id": "cus_1", "object": "customer"}', 'call', now())
RETURNING id`).Scan(&done))
	p, d := strconvI(parked), strconvI(done)

	r := run(t, env, "", "writebacks")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "cus_gone")
	require.Contains(t, r.stdout, "No such customer")
	require.Contains(t, r.stdout, "1 write-backs waiting for a human")
	require.NotContains(t, r.stdout, "cus_1")
	require.Equal(t, 1, decode(t, run(t, env, "", "writebacks", "--json")).Writebacks.Count)

	r = run(t, env, "", "writeback", p)
	require.Equal(t, 0, r.code, r.stderr)
	for _, want := range []string{"parked", "inbox:customer_metadata:in_9:payment", "evt_9", "404: No such customer"} {
		require.Contains(t, r.stdout, want)
	}
	r = run(t, env, "", "writeback", d)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "call cus_1")
	require.Equal(t, "call", decode(t, run(t, env, "", "writeback", d, "--json")).Writeback.ResultVia)

	before := opstest.Snapshot(t, fx.DB)
	r = run(t, env, "", "writeback-retry", p, "--dry-run", "--reason", "check")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "dry run: would retry write-back "+p)
	require.Equal(t, before, opstest.Snapshot(t, fx.DB))
	require.Equal(t, 1, fx.DB.Count(t, "writeback_intents", "id = $1 AND status = 'parked'", parked))

	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"writeback-retry", p}, "--reason is required"},
		{[]string{"writeback-retry", "abc", "--reason", "x"}, `writeback-retry "abc": a write-back ID is a positive number`},
		{[]string{"writeback-retry", "424242", "--reason", "x"}, "no write-back 424242"},
		{[]string{"writeback-retry", d, "--reason", "x"}, "is done (call, result cus_1): it is never sent again"},
		{[]string{"writeback", "424242"}, "no write-back 424242"},
		{[]string{"writeback"}, "writeback takes one write-back ID"},
	} {
		r := run(t, env, "", c.args...)
		require.Equal(t, opscli.ExitMistake, r.code, "%v: %s", c.args, r.stderr)
		require.Contains(t, r.stderr, c.says, c.args)
	}

	res := decode(t, run(t, env, "", "writeback-retry", p, "--reason", "customer restored", "--json")).WritebackRetry
	require.NotZero(t, res.AuditID)
	require.Equal(t, 1, fx.DB.Count(t, "ops_audit", "id = $1 AND action = 'writeback-retry' AND affected = 1 AND actor = 'bob' AND reason = 'customer restored'", res.AuditID))
	require.Equal(t, 1, fx.DB.Count(t, "writeback_intents", "id = $1 AND status = 'pending' AND attempts = 0 AND key_generation = 1 AND NOT refused AND available_at <= now()", parked))
	r = run(t, env, "", "writeback-retry", p, "--reason", "again")
	require.Equal(t, opscli.ExitMistake, r.code)
	require.Contains(t, r.stderr, "is still being tried by the sender")
	require.Contains(t, run(t, env, "", "writebacks").stdout, "no write-backs wait for a human")
	// The key shown is the one the sender sends now: the next generation.
	shown := decode(t, run(t, env, "", "writeback", p, "--json")).Writeback
	require.Equal(t, 1, shown.KeyGeneration)
	require.Equal(t, shown.IdempotencyKey+":retry1", shown.SentKey)
	require.Contains(t, run(t, env, "", "writeback", p).stdout, shown.IdempotencyKey+":retry1")
}
