package ops_test

import (
	"context"
	"encoding/json"
	"net/url"
	"testing"

	"github.com/aws/aws-lambda-go/lambdacontext"
	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/invokeproof"
	"github.com/stripe-inbox/inbox/internal/invokeproof/ststest"
	"github.com/stripe-inbox/inbox/internal/ops"
	"github.com/stripe-inbox/inbox/internal/ops/opstest"
)

type fnBundle struct {
	testBundle
	sts      *ststest.Server
	operator ststest.Principal
	fn       ops.Function
}

func setupFunction(t *testing.T) fnBundle {
	t.Helper()
	b := fnBundle{testBundle: setup(t), operator: ststest.RoleSession("AWSReservedSSO_Operators_abc", "dana@example.com", "ASIAOPERATOR")}
	b.sts = ststest.New(t, b.operator)
	u, err := url.Parse(b.sts.URL + "/")
	require.NoError(t, err)
	v, err := invokeproof.NewVerifier(u, invokeproof.Anyone, nil)
	require.NoError(t, err)
	b.fn = ops.Function{Ops: b.ops, Proofs: v}
	return b
}

// invocation is what the ops function's runtime hands the handler: the
// invocation's JSON, decoded into ops.Invocation.
func invocation(t *testing.T, payload any) ops.Invocation {
	t.Helper()
	raw, err := json.Marshal(payload)
	require.NoError(t, err)
	var in ops.Invocation
	require.NoError(t, json.Unmarshal(raw, &in))
	return in
}

func (b fnBundle) signed(t *testing.T, who ststest.Principal, r ops.Request) ops.Invocation {
	t.Helper()
	env, err := invokeproof.NewSigner(b.sts.Config(who)).Sign(context.Background(), ops.Audience, r)
	require.NoError(t, err)
	return invocation(t, env)
}

// lambdaCtx is the context the runtime gives the handler: the request id,
// and the invoked function's ARN (its account is the one admitted).
func lambdaCtx(requestID, account string) context.Context {
	return lambdacontext.NewContext(context.Background(), &lambdacontext.LambdaContext{
		AwsRequestID:       requestID,
		InvokedFunctionArn: "arn:aws:lambda:us-east-1:" + account + ":function:StripeInbox-dev-ops",
	})
}

// TestTheOpsFunctionRecordsTheVerifiedIdentity: a change sent by inboxctl
// (with a proof made with the operator's credentials) is recorded with the
// IAM identity STS verified, the claimed name beside it, the request id and
// the keys it touched; the claimed name never takes the identity's place.
func TestTheOpsFunctionRecordsTheVerifiedIdentity(t *testing.T) {
	t.Parallel()
	b := setupFunction(t)
	ctx := lambdaCtx("req-verified", ststest.Account)
	resp, err := b.fn.Invoke(ctx, b.signed(t, b.operator, ops.Request{
		Command: ops.CmdRetry, EventID: opstest.NeedsReview, Reason: "handler fixed", Actor: "the-ceo",
	}))
	require.NoError(t, err)
	require.Nil(t, resp.Error)
	var actor, arn, principalID, claimed, requestID, touched string
	require.NoError(t, b.fx.DB.Pool.QueryRow(ctx, `SELECT actor, principal_arn, principal_id, claimed_actor, request_id, touched::text FROM ops_audit WHERE id = $1`,
		resp.Retry.AuditID).Scan(&actor, &arn, &principalID, &claimed, &requestID, &touched))
	require.Equal(t, b.operator.ARN, actor)
	require.Equal(t, b.operator.ARN, arn)
	require.Equal(t, b.operator.UserID, principalID)
	require.Equal(t, "the-ceo", claimed, "kept, as claimed, beside the verified identity")
	require.Equal(t, "req-verified", requestID)
	require.JSONEq(t, `{"webhook_inbox":[["billing","`+opstest.NeedsReview+`"]]}`, touched)

	// The payload of a receipt (customer data), likewise.
	resp, err = b.fn.Invoke(ctx, b.signed(t, b.operator, ops.Request{Command: ops.CmdShow, EventID: opstest.Paid, Payload: true, Reason: "ticket 4"}))
	require.NoError(t, err)
	require.Nil(t, resp.Error)
	require.NotNil(t, resp.Show.Receipts[0].Payload)
	require.Equal(t, 1, b.fx.DB.Count(t, "ops_audit", "id = $1 AND action = 'show-payload' AND principal_arn = $2", resp.Show.AuditID, b.operator.ARN))
}

// TestTheOpsFunctionRefusesUnverifiedChanges: a change or a payload read
// without a proof (the console, aws lambda invoke), with a proof over
// another request, or signed by a principal of another account, is refused
// and changes nothing; reads need no proof.
func TestTheOpsFunctionRefusesUnverifiedChanges(t *testing.T) {
	t.Parallel()
	b := setupFunction(t)
	ctx := lambdaCtx("req-x", ststest.Account)
	retry := ops.Request{Command: ops.CmdRetry, Filter: ops.Filter{State: "failed"}, Reason: "x", Actor: "alice"}
	before := opstest.Snapshot(t, b.fx.DB)
	refused := func(what string, in ops.Invocation, says string) {
		t.Helper()
		resp, err := b.fn.Invoke(ctx, in)
		require.NoError(t, err, what)
		require.NotNil(t, resp.Error, what)
		require.Equal(t, ops.KindUnverified, resp.Error.Kind, what)
		require.Contains(t, resp.Error.Message, says, what)
		require.Equal(t, before, opstest.Snapshot(t, b.fx.DB), "%s: nothing changed", what)
	}
	refused("a bare request", invocation(t, retry), "send it with inboxctl --stage")
	refused("a bare payload read", invocation(t, ops.Request{Command: ops.CmdShow, EventID: opstest.Paid, Payload: true, Reason: "x"}), "show reads customer data")
	refused("a resolve", invocation(t, ops.Request{Command: ops.CmdResolve, AnomalyID: b.fx.AnomalyID, Note: "x"}), "resolve changes the inbox")

	// The proof of a dry run, with the request changed into the change.
	dry := retry
	dry.DryRun = true
	in := b.signed(t, b.operator, dry)
	raw, err := json.Marshal(retry)
	require.NoError(t, err)
	refused("a proof over another request", invocation(t, invokeproof.Envelope{Payload: raw, Proof: in.Proof}), "STS refused the request's proof")

	// A genuine proof, of a principal of another account than the
	// function's.
	other := lambdaCtx("req-y", "210987654321")
	resp, err := b.fn.Invoke(other, b.signed(t, b.operator, retry))
	require.NoError(t, err)
	require.Equal(t, ops.KindUnverified, resp.Error.Kind)
	require.Contains(t, resp.Error.Message, "this stage is in account 210987654321")
	require.Zero(t, b.fx.DB.Count(t, "ops_audit", ""))

	// Reads are served to any invoker, with or without a proof.
	resp, err = b.fn.Invoke(ctx, invocation(t, ops.Request{Command: ops.CmdStatus}))
	require.NoError(t, err)
	require.NotNil(t, resp.Status)
	resp, err = b.fn.Invoke(ctx, invocation(t, ops.Request{Command: ops.CmdShow, EventID: opstest.Paid}))
	require.NoError(t, err)
	require.Nil(t, resp.Show.Receipts[0].Payload)
	// A mistake is answered as such, before any proof is asked for.
	resp, err = b.fn.Invoke(ctx, invocation(t, ops.Request{Command: ops.CmdRetry, EventID: opstest.Backlog}))
	require.NoError(t, err)
	require.Equal(t, ops.KindInvalid, resp.Error.Kind)

	// STS unreachable: a failure, not a refusal, and nothing changed.
	b.sts.Fail(1, 500, "InternalFailure")
	_, err = b.fn.Invoke(ctx, b.signed(t, b.operator, retry))
	require.Error(t, err)
	require.Equal(t, before, opstest.Snapshot(t, b.fx.DB))
}

// The two forms of the ops function's input: inboxctl's envelope and a bare
// request, whose "payload" is show's flag.
func TestInvocationReadsBothForms(t *testing.T) {
	t.Parallel()
	var in ops.Invocation
	require.NoError(t, json.Unmarshal([]byte(`{"command":"show","event_id":"evt_1","payload":true,"reason":"r"}`), &in))
	require.Equal(t, ops.Request{Command: ops.CmdShow, EventID: "evt_1", Payload: true, Reason: "r"}, in.Request)
	require.Nil(t, in.Proof)
	require.Nil(t, in.Payload)

	raw := `{"payload": {"command":"show","event_id":"evt_2","payload":true}, "proof": {"v":1,"host":"sts.us-east-1.amazonaws.com"}}`
	in = ops.Invocation{}
	require.NoError(t, json.Unmarshal([]byte(raw), &in))
	require.Equal(t, "evt_2", in.Request.EventID)
	require.True(t, in.Request.Payload)
	require.Equal(t, `{"command":"show","event_id":"evt_2","payload":true}`, string(in.Payload), "the exact bytes the proof covers")
	require.Equal(t, "sts.us-east-1.amazonaws.com", in.Proof.Host)

	require.Error(t, json.Unmarshal([]byte(`{"payload": {"command": 5}}`), &ops.Invocation{}))
}
