package ops_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/ops"
	"github.com/stripe-inbox/inbox/internal/ops/opstest"
	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/stripeevent"
	"github.com/stripe-inbox/inbox/internal/stripetest"
)

type testBundle struct {
	fx  opstest.TestBundle
	ops *ops.Ops
}

func setup(t *testing.T) testBundle {
	t.Helper()
	fx := opstest.Seed(t, pgtest.DB(t))
	o, err := ops.New(fx.DB.Pool, ops.Config{MaxAttempts: opstest.MaxAttempts, APIVersion: stripetest.APIVersion}, slog.New(slog.NewJSONHandler(io.Discard, nil)))
	require.NoError(t, err)
	return testBundle{fx: fx, ops: o}
}

var me = ops.Caller{Actor: "alice"}

func (b testBundle) do(t *testing.T, r ops.Request) ops.Response {
	t.Helper()
	resp, err := b.ops.Do(context.Background(), r, me)
	require.NoError(t, err)
	return resp
}

// mistake runs r, requires an operator mistake of kind, and that nothing
// changed.
func (b testBundle) mistake(t *testing.T, r ops.Request, kind, says string) {
	t.Helper()
	before := opstest.Snapshot(t, b.fx.DB)
	_, err := b.ops.Do(context.Background(), r, me)
	var opErr *ops.Error
	require.True(t, errors.As(err, &opErr), "an operator mistake, got %v", err)
	require.Equal(t, kind, opErr.Kind, opErr.Message)
	require.Contains(t, opErr.Message, says)
	require.Equal(t, before, opstest.Snapshot(t, b.fx.DB), "nothing changed")
}

func eventIDs(page *ops.ReceiptPage) []string {
	var out []string
	for _, r := range page.Receipts {
		out = append(out, r.Endpoint+"/"+r.EventID)
	}
	return out
}

func TestStatus(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := b.do(t, ops.Request{Command: ops.CmdStatus}).Status
	require.Equal(t, 3, s.Backlog, "backlog, failed_1, failed_2")
	require.Positive(t, s.OldestUnprocessedAgeSeconds)
	require.Equal(t, 1, s.NeedsReview)
	require.Equal(t, 1, s.OpenAnomalies)
	require.Equal(t, 10, s.LastHour.Receipts)
	require.Equal(t, 1, s.LastHour.Duplicates, "the second delivery of evt_fx_paid on billing")
	require.Contains(t, s.LastHour.Types, inbox.TypeCount{EventType: "invoice.paid", Receipts: 3, Duplicates: 1})
	bySource := 0
	for _, c := range s.LastHour.Sources {
		bySource += c.Receipts
	}
	require.Equal(t, s.LastHour.Receipts, bySource, "every receipt counted under its source: %v", s.LastHour.Sources)
	require.NotEmpty(t, s.LastHour.Sources)
	require.Equal(t, 6, s.LastHour.Latency.Processed)
	require.GreaterOrEqual(t, s.LastHour.Latency.Max, s.LastHour.Latency.P99)
	require.Equal(t, stripetest.APIVersion, s.ExpectedAPIVersion)
	var unexpected []string
	for _, v := range s.APIVersions {
		if !v.Expected {
			unexpected = append(unexpected, v.Endpoint+" "+v.APIVersion)
			require.Equal(t, 1, v.Receipts)
		}
	}
	require.Equal(t, []string{"connect " + opstest.OtherAPIVersion}, unexpected)
}

func TestReceiptsFiltersAndPages(t *testing.T) {
	t.Parallel()
	b := setup(t)
	list := func(f ops.Filter) []string {
		return eventIDs(b.do(t, ops.Request{Command: ops.CmdReceipts, Filter: f}).Receipts)
	}
	sorted := func(s []string) []string { slices.Sort(s); return s }
	require.Equal(t, []string{"billing/" + opstest.Backlog, "billing/" + opstest.Failed1, "connect/" + opstest.Failed2},
		sorted(list(ops.Filter{State: "backlog"})))
	require.Equal(t, []string{"billing/" + opstest.Failed1, "connect/" + opstest.Failed2}, sorted(list(ops.Filter{State: "failed"})))
	require.Equal(t, []string{"billing/" + opstest.NeedsReview}, list(ops.Filter{State: "needs-review"}))
	require.Len(t, list(ops.Filter{State: "processed"}), 6)
	require.Equal(t, []string{"connect/" + opstest.Failed2}, list(ops.Filter{Endpoint: "connect", State: "failed"}))
	require.Equal(t, []string{"billing/" + opstest.Failed1}, list(ops.Filter{Error: "DEADLOCK"}), "case-insensitive substring")
	require.Equal(t, []string{"billing/" + opstest.Failed1, "connect/" + opstest.Failed2}, sorted(list(ops.Filter{Type: "refund.created"})))
	future := time.Now().Add(time.Hour)
	require.Empty(t, list(ops.Filter{Since: &future}))
	require.Len(t, list(ops.Filter{Until: &future}), 10)

	// Pages of 4, newest first, cover every receipt once.
	var all []string
	var last time.Time
	after := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, 5)
		p := b.do(t, ops.Request{Command: ops.CmdReceipts, Limit: 4, After: after}).Receipts
		for _, r := range p.Receipts {
			if !last.IsZero() {
				require.False(t, r.ReceivedAt.After(last), "newest first")
			}
			last = r.ReceivedAt
		}
		all = append(all, eventIDs(p)...)
		if p.Next == "" {
			break
		}
		require.Equal(t, 4, p.Count)
		after = p.Next
	}
	require.Len(t, all, 10)
	require.Len(t, slices.Compact(sorted(all)), 10, "no receipt twice")
}

func TestShow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := b.do(t, ops.Request{Command: ops.CmdShow, EventID: opstest.Paid, Payload: true, Reason: "ticket 9"}).Show
	require.Len(t, s.Receipts, 2, "billing and connect")
	bill := s.Receipts[0]
	require.Equal(t, "billing", bill.Endpoint)
	require.Equal(t, "processed", bill.State)
	require.Equal(t, "applied", bill.Outcome)
	require.Equal(t, 1, bill.Attempts)
	require.Equal(t, 1, bill.Duplicates)
	require.Equal(t, "webhook", bill.Source, "delivered by Stripe, not found by the reconciler")
	require.False(t, bill.ListedFirst)
	require.Equal(t, stripetest.APIVersion, bill.APIVersion)
	require.Equal(t, stripeevent.Fingerprint(opstest.SecretNew), bill.SecretFingerprint)
	require.NotNil(t, bill.SignedAt)
	require.NotNil(t, bill.ProcessedAt)
	require.Contains(t, string(bill.Payload), `"id": "evt_fx_paid"`)
	require.Len(t, s.Effects.Ledger, 1)
	require.Equal(t, "payment", s.Effects.Ledger[0].Kind)
	require.EqualValues(t, 2500, s.Effects.Ledger[0].Amount)
	require.Len(t, s.Effects.Outbox, 1)
	require.Equal(t, "InvoicePaymentBooked", s.Effects.Outbox[0].EventType)
	require.Len(t, s.Effects.Invoices, 1)
	require.Equal(t, "paid", s.Effects.Invoices[0].Status)
	// Reading the payload (customer data) is audited like a change, with
	// the keys of the receipts shown; it takes a reason.
	require.Positive(t, s.AuditID)
	require.Equal(t, 1, b.fx.DB.Count(t, "ops_audit", "id = $1 AND action = 'show-payload' AND affected = 2 AND reason = 'ticket 9' AND actor = 'alice' AND touched = $2::jsonb",
		s.AuditID, `{"webhook_inbox":[["billing","`+opstest.Paid+`"],["connect","`+opstest.Paid+`"]]}`))
	b.mistake(t, ops.Request{Command: ops.CmdShow, EventID: opstest.Paid, Payload: true}, ops.KindInvalid, "--reason is required: say why you read the customer's data")

	// Without --payload, no payload and no audit row; one endpoint only
	// with --endpoint.
	audits := b.fx.DB.Count(t, "ops_audit", "")
	s = b.do(t, ops.Request{Command: ops.CmdShow, EventID: opstest.Paid, Filter: ops.Filter{Endpoint: "connect"}}).Show
	require.Len(t, s.Receipts, 1)
	require.Nil(t, s.Receipts[0].Payload)
	require.Zero(t, s.AuditID)
	require.Equal(t, audits, b.fx.DB.Count(t, "ops_audit", ""))

	s = b.do(t, ops.Request{Command: ops.CmdShow, EventID: opstest.PaidOnVoid}).Show
	require.Len(t, s.Effects.Anomalies, 1)
	require.Equal(t, "payment_on_void_invoice", s.Effects.Anomalies[0].Kind)
	// A payment on a void invoice is booked, and the invoice is paid.
	require.Len(t, s.Effects.Ledger, 1)
	require.Equal(t, "payment", s.Effects.Ledger[0].Kind)
	require.EqualValues(t, 700, s.Effects.Ledger[0].Amount)
	require.Len(t, s.Effects.Outbox, 1)
	require.Equal(t, "paid", s.Effects.Invoices[0].Status)

	s = b.do(t, ops.Request{Command: ops.CmdShow, EventID: opstest.NeedsReview}).Show
	require.Equal(t, "needs-review", s.Receipts[0].State)
	require.Nil(t, s.Receipts[0].AvailableAt, "waits for review")
	require.Equal(t, "bad_payload: no charge id", s.Receipts[0].LastError)

	b.mistake(t, ops.Request{Command: ops.CmdShow, EventID: "evt_unknown"}, ops.KindNotFound, "no receipt of event evt_unknown")
	b.mistake(t, ops.Request{Command: ops.CmdShow, EventID: opstest.Backlog, Filter: ops.Filter{Endpoint: "connect"}}, ops.KindNotFound, "on endpoint connect")
}

// retry with a filter changes exactly the matching rows, in one statement
// with its audit row; --dry-run changes nothing.
func TestRetryWithAFilterChangesExactlyTheMatchingRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	before := opstest.Snapshot(t, b.fx.DB)
	dry := b.do(t, ops.Request{Command: ops.CmdRetry, Filter: ops.Filter{State: "failed"}, DryRun: true, Reason: "trying"}).Retry
	require.Equal(t, 1, dry.Count)
	require.Equal(t, []ops.ReceiptKey{{Endpoint: "billing", EventID: opstest.Failed1}}, dry.Receipts)
	require.Equal(t, 1, dry.SkippedCount, "the other failed receipt waits out its backoff: held like a lease")
	require.Equal(t, "connect/"+opstest.Failed2, dry.Skipped[0].Endpoint+"/"+dry.Skipped[0].EventID)
	require.True(t, dry.Skipped[0].Until.After(time.Now()))
	require.Zero(t, dry.AuditID)
	require.Equal(t, before, opstest.Snapshot(t, b.fx.DB), "a dry run changes nothing")

	// Everything but the matching row, as it was.
	others := func() string {
		var s string
		require.NoError(t, b.fx.DB.Pool.QueryRow(ctx, `SELECT string_agg(w::text, E'\n' ORDER BY endpoint, event_id) FROM webhook_inbox w WHERE event_id <> $1`, opstest.Failed1).Scan(&s))
		return s
	}
	othersBefore := others()
	res := b.do(t, ops.Request{Command: ops.CmdRetry, Filter: ops.Filter{State: "failed", Endpoint: "billing"}, Reason: "deadlock fixed"}).Retry
	require.Equal(t, 1, res.Count)
	require.Equal(t, []ops.ReceiptKey{{Endpoint: "billing", EventID: opstest.Failed1}}, res.Receipts)
	require.Positive(t, res.AuditID)
	require.Equal(t, othersBefore, others(), "no other receipt changed")
	require.Equal(t, 1, b.fx.DB.Count(t, "webhook_inbox", "event_id = $1 AND attempts = 0 AND available_at <= now() AND processed_at IS NULL AND last_error LIKE 'pg 40P01%'", opstest.Failed1))

	var action, filter, reason, actor string
	var affected int
	var requestID *string
	require.NoError(t, b.fx.DB.Pool.QueryRow(ctx, "SELECT action, filter::text, affected, reason, actor, request_id FROM ops_audit WHERE id = $1", res.AuditID).
		Scan(&action, &filter, &affected, &reason, &actor, &requestID))
	require.Equal(t, "retry", action)
	require.JSONEq(t, `{"state":"failed","endpoint":"billing"}`, filter)
	require.Equal(t, 1, affected)
	require.Equal(t, "deadlock fixed", reason)
	require.Equal(t, "alice", actor)
	require.Nil(t, requestID)
	// The keys of the rows it touched; locally no verified identity, the
	// name as claimed.
	var touched string
	var principal, claimed *string
	require.NoError(t, b.fx.DB.Pool.QueryRow(ctx, "SELECT touched::text, principal_arn, claimed_actor FROM ops_audit WHERE id = $1", res.AuditID).
		Scan(&touched, &principal, &claimed))
	require.JSONEq(t, `{"webhook_inbox":[["billing","`+opstest.Failed1+`"]]}`, touched)
	require.Nil(t, principal)
	require.Equal(t, "alice", *claimed)
}

func TestRetryOneEvent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res := b.do(t, ops.Request{Command: ops.CmdRetry, EventID: opstest.NeedsReview, Reason: "handler fixed in v1.2"}).Retry
	require.Equal(t, 1, res.Count)
	require.Equal(t, 1, b.fx.DB.Count(t, "webhook_inbox", "event_id = $1 AND attempts = 0 AND available_at < 'infinity'", opstest.NeedsReview))
	require.Equal(t, 1, b.fx.DB.Count(t, "ops_audit", "action = 'retry' AND filter = $1::jsonb", `{"event_id":"`+opstest.NeedsReview+`"}`))

	b.mistake(t, ops.Request{Command: ops.CmdRetry, EventID: "evt_nope", Reason: "x"}, ops.KindNotFound, "no receipt of event evt_nope")
	b.mistake(t, ops.Request{Command: ops.CmdRetry, EventID: opstest.Paid, Reason: "x"}, ops.KindConflict, "is processed")
	b.mistake(t, ops.Request{Command: ops.CmdRetry, EventID: opstest.Backlog}, ops.KindInvalid, "--reason is required")
	b.mistake(t, ops.Request{Command: ops.CmdRetry, EventID: opstest.Backlog, Reason: "   "}, ops.KindInvalid, "--reason is required")
	b.mistake(t, ops.Request{Command: ops.CmdRetry, Reason: "everything"}, ops.KindInvalid, "needs an EVENT_ID or a filter")
	b.mistake(t, ops.Request{Command: ops.CmdRetry, Filter: ops.Filter{State: "processed"}, Reason: "x"}, ops.KindInvalid, "never retried")
}

func TestAnomaliesAndResolve(t *testing.T) {
	t.Parallel()
	b := setup(t)
	list := b.do(t, ops.Request{Command: ops.CmdAnomalies}).Anomalies
	require.Equal(t, 1, list.Count)
	require.Equal(t, b.fx.AnomalyID, list.Anomalies[0].ID)
	require.Equal(t, opstest.PaidOnVoid, list.Anomalies[0].EventID)

	b.mistake(t, ops.Request{Command: ops.CmdResolve, AnomalyID: b.fx.AnomalyID}, ops.KindInvalid, "--note is required")
	b.mistake(t, ops.Request{Command: ops.CmdResolve, AnomalyID: 999999, Note: "x"}, ops.KindNotFound, "no anomaly 999999")

	res := b.do(t, ops.Request{Command: ops.CmdResolve, AnomalyID: b.fx.AnomalyID, Note: "refunded in the dashboard, ticket 7"}).Resolved
	require.NotNil(t, res.Anomaly.ResolvedAt)
	require.Equal(t, "refunded in the dashboard, ticket 7", res.Anomaly.Resolution)
	require.Equal(t, 1, b.fx.DB.Count(t, "ops_audit", "id = $1 AND action = 'resolve' AND affected = 1 AND actor = 'alice' AND touched = $2::jsonb",
		res.AuditID, fmt.Sprintf(`{"anomalies":[%d]}`, b.fx.AnomalyID)))
	require.Zero(t, b.do(t, ops.Request{Command: ops.CmdAnomalies}).Anomalies.Count)
	require.Equal(t, 1, b.do(t, ops.Request{Command: ops.CmdAnomalies, All: true}).Anomalies.Count)

	b.mistake(t, ops.Request{Command: ops.CmdResolve, AnomalyID: b.fx.AnomalyID, Note: "again"}, ops.KindConflict, "already resolved")
}

func TestSecretsShowsWhichSecretMatched(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rep := b.do(t, ops.Request{Command: ops.CmdSecrets}).Secrets
	require.Equal(t, 24*time.Hour.Seconds(), rep.WindowSeconds)
	got := map[string]int{}
	for _, s := range rep.Secrets {
		got[s.Endpoint+" "+s.Fingerprint] = s.Receipts
	}
	require.Equal(t, map[string]int{
		"billing " + stripeevent.Fingerprint(opstest.SecretNew):     6,
		"billing " + stripeevent.Fingerprint(opstest.SecretOld):     1,
		"connect " + stripeevent.Fingerprint(opstest.SecretConnect): 3,
	}, got)
	require.Equal(t, 7*24*time.Hour.Seconds(), b.do(t, ops.Request{Command: ops.CmdSecrets, Window: "7d"}).Secrets.WindowSeconds)
}

// Requests no command accepts: a message that says what to do, nothing
// changed.
func TestBadRequestsChangeNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := time.Now()
	for _, c := range []struct {
		req  ops.Request
		says string
	}{
		{ops.Request{Command: "delete"}, "unknown command"},
		{ops.Request{Command: ops.CmdReceipts, Filter: ops.Filter{State: "stuck"}}, "--state \"stuck\": use one of backlog, failed, needs-review, processed"},
		{ops.Request{Command: ops.CmdReceipts, Filter: ops.Filter{Since: &now, Until: &now}}, "is not before --until"},
		{ops.Request{Command: ops.CmdReceipts, After: "not-a-cursor"}, "is not a page cursor"},
		{ops.Request{Command: ops.CmdReceipts, Limit: 5000}, "--limit 5000"},
		{ops.Request{Command: ops.CmdSecrets, Window: "forever"}, "--window \"forever\""},
		{ops.Request{Command: ops.CmdShow}, "show needs an EVENT_ID"},
		{ops.Request{Command: ops.CmdResolve, Note: "x"}, "resolve needs the anomaly's ID"},
		{ops.Request{Command: ops.CmdRetry, Filter: ops.Filter{State: "stuck"}, Reason: "x"}, "--state \"stuck\""},
	} {
		b.mistake(t, c.req, ops.KindInvalid, c.says)
	}
}
