package opscli_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/ops"
	"github.com/stripe-inbox/inbox/internal/ops/opstest"
	"github.com/stripe-inbox/inbox/internal/opscli"
)

// The outbox rows that wait for a human: in status, listed, retried by id
// and with --waiting, each with its figures; --dry-run changes nothing.
func TestOutboxCommandsLocally(t *testing.T) {
	t.Parallel()
	fx, env := setup(t)
	w1, w2 := strconvI(fx.OutboxWaiting[0]), strconvI(fx.OutboxWaiting[1])

	r := run(t, env, "", "status")
	require.Equal(t, 0, r.code, r.stderr)
	for _, want := range []string{"outbox backlog      3", "oldest unpublished  10m", "outbox waiting      2  (at 10 attempts; inboxctl outbox)"} {
		require.Contains(t, r.stdout, want)
	}
	var raw map[string]any
	require.NoError(t, json.Unmarshal([]byte(run(t, env, "", "status", "--json").stdout), &raw))
	st := raw["status"].(map[string]any)
	require.EqualValues(t, 3, st["outbox_backlog"])
	require.EqualValues(t, 2, st["outbox_needs_review"])
	require.Greater(t, st["outbox_oldest_age_seconds"], 599.0)

	r = run(t, env, "", "outbox")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "2 outbox rows waiting for a human")
	require.Contains(t, r.stdout, opstest.OutboxError)
	require.Less(t, strings.Index(r.stdout, "in_fx_w2"), strings.Index(r.stdout, "in_fx_w1"), "newest first")
	require.NotContains(t, r.stdout, "in_fx_p", "never a published row")
	page := decode(t, run(t, env, "", "outbox", "--json", "--limit", "1")).Outbox
	require.Equal(t, 1, page.Count)
	require.Equal(t, fx.OutboxWaiting[1], page.Rows[0].ID)
	page = decode(t, run(t, env, "", "outbox", "--json", "--limit", "1", "--after", page.Next)).Outbox
	require.Equal(t, fx.OutboxWaiting[0], page.Rows[0].ID)
	require.Equal(t, 5, decode(t, run(t, env, "", "outbox", "--all-unpublished", "--json")).Outbox.Count, "the 2 waiting, the failing one, evt_fx_paid's and evt_fx_paid_void's")

	before := opstest.Snapshot(t, fx.DB)
	r = run(t, env, "", "outbox-retry", "--waiting", "--dry-run", "--reason", "check")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "dry run: would retry 2 outbox rows (nothing changed)")
	require.Contains(t, r.stdout, w1+" "+w2)
	require.Equal(t, before, opstest.Snapshot(t, fx.DB))

	res := decode(t, run(t, env, "", "outbox-retry", w2, "--reason", "rule fixed", "--json")).OutboxRetry
	require.Equal(t, []int64{fx.OutboxWaiting[1]}, res.IDs)
	require.Equal(t, 1, fx.DB.Count(t, "ops_audit", "id = $1 AND action = 'outbox-retry' AND affected = 1 AND actor = 'bob'", res.AuditID))
	r = run(t, env, "", "outbox-retry", "--waiting", "--reason", "bus policy fixed")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "retried 1 outbox rows")
	require.Contains(t, r.stdout, "audit row")
	require.Equal(t, 2, fx.DB.Count(t, "outbox", "attempts = 0 AND available_at <= now() AND last_error IS NOT NULL"))
	require.Equal(t, 1, fx.DB.Count(t, "outbox", "id = $1 AND attempts = 10 AND published_at IS NOT NULL", fx.OutboxPublished))
	require.Contains(t, run(t, env, "", "outbox").stdout, "no outbox rows wait for a human")
}

// Outbox mistakes: exit 2, a message that says what to do, nothing changed.
func TestOutboxMistakesExitTwoAndChangeNothing(t *testing.T) {
	t.Parallel()
	fx, env := setup(t)
	w1 := strconvI(fx.OutboxWaiting[0])
	before := opstest.Snapshot(t, fx.DB)
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"outbox-retry", "424242", "--reason", "x"}, "no outbox row 424242"},
		{[]string{"outbox-retry", w1, "424242", "--reason", "x"}, "no outbox row 424242"},
		{[]string{"outbox-retry", w1}, "--reason is required"},
		{[]string{"outbox-retry", "--waiting", "--dry-run"}, "--reason is required"},
		{[]string{"outbox-retry", "abc", "--reason", "x"}, `outbox-retry "abc": an outbox row ID is a positive number`},
		{[]string{"outbox-retry", "0", "--reason", "x"}, `outbox-retry "0": an outbox row ID is a positive number`},
		{[]string{"outbox-retry", "--reason", "x"}, "needs outbox row IDs"},
		{[]string{"outbox-retry", w1, "--waiting", "--reason", "x"}, "IDs or --waiting, not both"},
		{[]string{"outbox-retry", strconvI(fx.OutboxPublished), "--reason", "x"}, "was published at"},
		{[]string{"outbox-retry", strconvI(fx.OutboxFailing), "--reason", "x"}, "is still being tried by the relay"},
		{[]string{"outbox-retry", "--state", "failed", "--reason", "x"}, "unknown flag --state for outbox-retry"},
		{[]string{"outbox", "--after", "garbage"}, "is not a page cursor of inboxctl outbox"},
		{[]string{"outbox", "12"}, "outbox takes no argument"},
	} {
		r := run(t, env, "", c.args...)
		require.Equal(t, opscli.ExitMistake, r.code, "%v: %s", c.args, r.stderr)
		require.Contains(t, r.stderr, c.says, c.args)
		require.Empty(t, r.stdout, c.args)
		rj := run(t, env, "", append(c.args, "--json")...)
		require.Equal(t, opscli.ExitMistake, rj.code, c.args)
		var e struct{ Error ops.Error }
		require.NoError(t, json.Unmarshal([]byte(rj.stdout), &e), rj.stdout)
		require.Contains(t, e.Error.Message, c.says)
	}
	require.Equal(t, before, opstest.Snapshot(t, fx.DB), "nothing changed")
}
