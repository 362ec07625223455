package ops_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/ops"
	"github.com/stripe-inbox/inbox/internal/ops/opstest"
	"github.com/stripe-inbox/inbox/internal/outbox"
)

func outboxIDs(p *ops.OutboxPage) []int64 {
	var out []int64
	for _, r := range p.Rows {
		out = append(out, r.ID)
	}
	return out
}

// outboxRows is every outbox row as text, but for the ids given.
func (b testBundle) outboxRowsBut(t *testing.T, ids ...int64) string {
	t.Helper()
	var s string
	require.NoError(t, b.fx.DB.Pool.QueryRow(context.Background(),
		`SELECT string_agg(x::text, E'\n' ORDER BY id) FROM outbox x WHERE NOT id = ANY($1::bigint[])`, ids).Scan(&s))
	return s
}

func TestStatusShowsTheOutbox(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := b.do(t, ops.Request{Command: ops.CmdStatus}).Status
	require.Equal(t, 3, s.OutboxBacklog, "evt_fx_paid's row, evt_fx_paid_void's (a payment on a void invoice is booked) and the failing one")
	require.GreaterOrEqual(t, s.OutboxOldestAgeSeconds, 600.0, "the failing row, 10 minutes old")
	require.Equal(t, 2, s.OutboxNeedsReview, "the two waiting rows; not the published one")
	require.Equal(t, outbox.DefaultMaxAttempts, s.OutboxMaxAttempts)
}

// outbox lists exactly the rows waiting for a human, newest first, a page
// at a time; with AllUnpublished every unpublished row.
func TestOutboxListsTheRowsWaitingForAHuman(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w1, w2 := b.fx.OutboxWaiting[0], b.fx.OutboxWaiting[1]
	p := b.do(t, ops.Request{Command: ops.CmdOutbox}).Outbox
	require.Equal(t, []int64{w2, w1}, outboxIDs(p), "newest first")
	require.Equal(t, 2, p.Count)
	require.Empty(t, p.Next)
	r := p.Rows[0]
	require.Equal(t, "InvoicePaymentBooked", r.EventType)
	require.Equal(t, "in_fx_w2", r.AggregateID)
	require.Equal(t, 10, r.Attempts)
	require.Equal(t, opstest.OutboxError, r.LastError)
	require.Equal(t, outbox.StateWaiting, r.State)
	require.Nil(t, r.AvailableAt)

	p = b.do(t, ops.Request{Command: ops.CmdOutbox, Limit: 1}).Outbox
	require.Equal(t, []int64{w2}, outboxIDs(p))
	require.NotEmpty(t, p.Next)
	p = b.do(t, ops.Request{Command: ops.CmdOutbox, Limit: 1, After: p.Next}).Outbox
	require.Equal(t, []int64{w1}, outboxIDs(p))
	require.Empty(t, p.Next)

	all := b.do(t, ops.Request{Command: ops.CmdOutbox, AllUnpublished: true}).Outbox
	require.Len(t, all.Rows, 5, "waiting, failing, evt_fx_paid's, evt_fx_paid_void's; never the published one")
	require.NotContains(t, outboxIDs(all), b.fx.OutboxPublished)
	for _, r := range all.Rows {
		if r.ID == b.fx.OutboxFailing {
			require.Equal(t, outbox.StateBacklog, r.State)
			require.NotNil(t, r.AvailableAt)
		}
	}

	b.mistake(t, ops.Request{Command: ops.CmdOutbox, After: "garbage"}, ops.KindInvalid, "is not a page cursor of inboxctl outbox")
}

func TestOutboxRetryByID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w1, w2 := b.fx.OutboxWaiting[0], b.fx.OutboxWaiting[1]
	before := opstest.Snapshot(t, b.fx.DB)
	dry := b.do(t, ops.Request{Command: ops.CmdOutboxRetry, OutboxIDs: []int64{w2}, DryRun: true, Reason: "check"}).OutboxRetry
	require.Equal(t, []int64{w2}, dry.IDs)
	require.Equal(t, 1, dry.Count)
	require.Zero(t, dry.AuditID)
	require.Equal(t, before, opstest.Snapshot(t, b.fx.DB), "a dry run changes nothing")

	others := b.outboxRowsBut(t, w2)
	res := b.do(t, ops.Request{Command: ops.CmdOutboxRetry, OutboxIDs: []int64{w2, w2}, Reason: "rule fixed"}).OutboxRetry
	require.Equal(t, []int64{w2}, res.IDs)
	require.Positive(t, res.AuditID)
	require.Equal(t, others, b.outboxRowsBut(t, w2), "no other row changed")
	require.Equal(t, 1, b.fx.DB.Count(t, "outbox", "id = $1 AND attempts = 0 AND available_at <= now() AND published_at IS NULL AND claim_token IS NULL AND last_error = $2", w2, opstest.OutboxError))
	require.Equal(t, 1, b.fx.DB.Count(t, "ops_audit", "id = $1 AND action = 'outbox-retry' AND affected = 1 AND reason = 'rule fixed' AND actor = 'alice' AND filter = $2::jsonb AND touched = $3::jsonb",
		res.AuditID, `{"outbox_ids":[`+itoa(w2)+`]}`, `{"outbox":[`+itoa(w2)+`]}`))
	require.Equal(t, []int64{w1}, outboxIDs(b.do(t, ops.Request{Command: ops.CmdOutbox}).Outbox))

	// Mistakes change nothing, even beside a good id.
	b.mistake(t, ops.Request{Command: ops.CmdOutboxRetry, OutboxIDs: []int64{w1, 999999}, Reason: "x"}, ops.KindNotFound, "no outbox row 999999")
	b.mistake(t, ops.Request{Command: ops.CmdOutboxRetry, OutboxIDs: []int64{w1, b.fx.OutboxPublished}, Reason: "x"}, ops.KindConflict, "was published at")
	b.mistake(t, ops.Request{Command: ops.CmdOutboxRetry, OutboxIDs: []int64{b.fx.OutboxFailing}, Reason: "x"}, ops.KindConflict, "is still being tried by the relay (3 of 10 attempts)")
	b.mistake(t, ops.Request{Command: ops.CmdOutboxRetry, OutboxIDs: []int64{w2}, Reason: "x"}, ops.KindConflict, "is still being tried by the relay (0 of 10 attempts)")
	b.mistake(t, ops.Request{Command: ops.CmdOutboxRetry, OutboxIDs: []int64{w1}}, ops.KindInvalid, "--reason is required")
	b.mistake(t, ops.Request{Command: ops.CmdOutboxRetry, Reason: "x"}, ops.KindInvalid, "needs outbox row IDs")
	b.mistake(t, ops.Request{Command: ops.CmdOutboxRetry, OutboxIDs: []int64{w1}, Waiting: true, Reason: "x"}, ops.KindInvalid, "IDs or --waiting, not both")
	b.mistake(t, ops.Request{Command: ops.CmdOutboxRetry, OutboxIDs: []int64{-4}, Reason: "x"}, ops.KindInvalid, "an ID is a positive number")
}

// --waiting retries exactly the rows waiting for a human, never a
// published row or one still being tried, nor one a relay holds.
func TestOutboxRetryWaiting(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	w1, w2 := b.fx.OutboxWaiting[0], b.fx.OutboxWaiting[1]
	// A third row used up its attempts while a relay still holds it.
	var held int64
	require.NoError(t, b.fx.DB.Pool.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, attempts, available_at, leased_until, claim_token)
VALUES ('invoice', 'in_fx_h', 'InvoicePaymentBooked', '{}', 10, now() + interval '1 hour', now() + interval '1 hour', gen_random_uuid()) RETURNING id`).Scan(&held))

	before := opstest.Snapshot(t, b.fx.DB)
	dry := b.do(t, ops.Request{Command: ops.CmdOutboxRetry, Waiting: true, DryRun: true, Reason: "check"}).OutboxRetry
	require.Equal(t, []int64{w1, w2}, dry.IDs)
	require.Equal(t, before, opstest.Snapshot(t, b.fx.DB), "a dry run changes nothing")
	b.mistake(t, ops.Request{Command: ops.CmdOutboxRetry, OutboxIDs: []int64{held}, Reason: "x"}, ops.KindConflict, "is held by a relay")

	others := b.outboxRowsBut(t, w1, w2)
	res := b.do(t, ops.Request{Command: ops.CmdOutboxRetry, Waiting: true, Reason: "bus policy fixed"}).OutboxRetry
	require.Equal(t, []int64{w1, w2}, res.IDs)
	require.Equal(t, 2, res.Count)
	require.Equal(t, others, b.outboxRowsBut(t, w1, w2), "published, failing, held and evt_fx_paid's rows as they were")
	require.Equal(t, 2, b.fx.DB.Count(t, "outbox", "id = ANY($1) AND attempts = 0 AND available_at <= now()", []int64{w1, w2}))
	require.Equal(t, 1, b.fx.DB.Count(t, "ops_audit", "id = $1 AND action = 'outbox-retry' AND affected = 2 AND filter = '{\"waiting\": true}'::jsonb", res.AuditID))

	// Nothing left waiting: a retry of none is not a mistake, and audited.
	again := b.do(t, ops.Request{Command: ops.CmdOutboxRetry, Waiting: true, Reason: "again"}).OutboxRetry
	require.Zero(t, again.Count)
	require.Equal(t, []int64{}, again.IDs)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
