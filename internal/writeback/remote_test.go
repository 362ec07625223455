package writeback_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/invokeproof"
	"github.com/stripe-inbox/inbox/internal/invokeproof/ststest"
	"github.com/stripe-inbox/inbox/internal/metrics"
	"github.com/stripe-inbox/inbox/internal/writeback"
)

const senderRole = "StripeInbox-dev-WritebackFunctionServiceRole"

// proofs is an STS stand-in that knows the writeback function's role
// session, the reconciler's and a developer's, and a verifier that admits
// the writeback function's role only.
type proofs struct {
	sts        *ststest.Server
	sender     ststest.Principal
	reconciler ststest.Principal
	developer  ststest.Principal
	verifier   *invokeproof.Verifier
}

func newProofs(t *testing.T) proofs {
	t.Helper()
	p := proofs{
		sender:     ststest.RoleSession(senderRole, "StripeInbox-dev-writeback", "ASIAWRITEBACK"),
		reconciler: ststest.RoleSession("StripeInbox-dev-ReconcileFunctionServiceRole", "StripeInbox-dev-reconcile", "ASIARECONCILER"),
		developer:  ststest.RoleSession("Developer", "dev@example.com", "ASIADEVELOPER"),
	}
	p.sts = ststest.New(t, p.sender, p.reconciler, p.developer)
	admit, err := invokeproof.Role(ststest.RoleARN(senderRole))
	require.NoError(t, err)
	u, err := url.Parse(p.sts.URL + "/")
	require.NoError(t, err)
	p.verifier, err = invokeproof.NewVerifier(u, admit, nil)
	require.NoError(t, err)
	return p
}

// lambdaLoop is a Lambda client whose Invoke runs the store function's
// handler in process, through JSON as the Lambda service carries it.
type lambdaLoop struct {
	store *writeback.ProvenStore
	calls int
}

func (l *lambdaLoop) Invoke(ctx context.Context, in *lambda.InvokeInput, _ ...func(*lambda.Options)) (*lambda.InvokeOutput, error) {
	l.calls++
	var env invokeproof.Envelope
	if err := json.Unmarshal(in.Payload, &env); err != nil {
		return nil, err
	}
	res, err := l.store.Invoke(ctx, env)
	if err != nil {
		kind := "Unhandled"
		body, _ := json.Marshal(map[string]string{"errorMessage": err.Error()})
		return &lambda.InvokeOutput{FunctionError: &kind, Payload: body, StatusCode: 200}, nil
	}
	body, err := json.Marshal(res)
	return &lambda.InvokeOutput{Payload: body, StatusCode: 200}, err
}

func (b *bundle) provenStore(p proofs, emf, logs *bytes.Buffer) *writeback.ProvenStore {
	return &writeback.ProvenStore{
		Store:   writeback.StoreHandler{Store: writeback.DBStore{DB: b.db.Pool}},
		Proofs:  p.verifier,
		Metrics: metrics.New(emf, "Test", map[string]string{"Service": "writebackstore"}),
		Logger:  slog.New(slog.NewJSONHandler(logs, nil)),
	}
}

// TestTheRemoteSenderSendsThroughTheStoreFunction: the sender outside the
// VPC, its store the writebackstore function (RemoteStore, each request
// proven with the writeback function's role): the intent is claimed, sent
// once and recorded; a run after it calls nothing; the backlog is read
// through the function and its gauges emitted.
func TestTheRemoteSenderSendsThroughTheStoreFunction(t *testing.T) {
	t.Parallel()
	b := setup(t, "cus_1")
	p := newProofs(t)
	var emf, logs bytes.Buffer
	loop := &lambdaLoop{store: b.provenStore(p, &emf, &logs)}
	remote := writeback.RemoteStore{Lambda: loop, Function: "writebackstore", Prover: invokeproof.NewSigner(p.sts.Config(p.sender))}

	b.pay(t, "in_1", "cus_1")
	var gauges bytes.Buffer
	em := metrics.New(&gauges, "Test", nil)
	bl, err := writeback.EmitBacklog(context.Background(), remote, em)
	require.NoError(t, err)
	require.Equal(t, 1, bl.Pending)
	require.Contains(t, gauges.String(), `"WritebacksPending":1`)

	s := b.senderWith(t, remote, testConfig())
	sum := b.run(t, s)
	require.Equal(t, 1, sum.Calls)
	require.Equal(t, 1, sum.Done)
	require.Equal(t, 1, b.stripe.Applied(handlers.CustomerMetadataKey("in_1")))
	status, via, attempts := b.intent(t, "in_1")
	require.Equal(t, "done", status)
	require.Equal(t, writeback.ViaCall, via)
	require.Equal(t, 1, attempts)
	before := len(b.stripe.Requests())
	b.run(t, s)
	require.Len(t, b.stripe.Requests(), before, "a recorded intent is never called again")

	bl, err = writeback.EmitBacklog(context.Background(), remote, em)
	require.NoError(t, err)
	require.Equal(t, writeback.Backlog{}, bl)
	require.Empty(t, emf.String(), "nothing was refused")
}

// TestTheStoreFunctionServesOnlyTheSendersRequests: a developer's genuine
// proof, the reconciler's (a proof for its own store), the sender's proof
// with the request swapped, no proof, and the sender's proof replayed
// after the window: each refused before the database is touched (the
// intent stays unclaimed), counted by reason. The sender's own request is
// served.
func TestTheStoreFunctionServesOnlyTheSendersRequests(t *testing.T) {
	t.Parallel()
	b := setup(t, "cus_1")
	p := newProofs(t)
	var emf, logs bytes.Buffer
	store := b.provenStore(p, &emf, &logs)
	b.pay(t, "in_1", "cus_1")
	ctx := context.Background()
	claim := writeback.StoreRequest{Op: writeback.OpClaim, Limit: 10, Lease: time.Minute, KeyLifetime: writeback.KeyLifetime}
	sign := func(who ststest.Principal, audience string, req writeback.StoreRequest, at time.Time) invokeproof.Envelope {
		s := invokeproof.NewSigner(p.sts.Config(who))
		s.Now = func() time.Time { return at }
		env, err := s.Sign(ctx, audience, req)
		require.NoError(t, err)
		return env
	}

	_, err := store.Invoke(ctx, sign(p.developer, writeback.StoreAudience, claim, time.Now()))
	require.ErrorIs(t, err, writeback.ErrRefused)
	require.ErrorContains(t, err, "(principal)")

	_, err = store.Invoke(ctx, sign(p.reconciler, writeback.StoreAudience, claim, time.Now()))
	require.ErrorIs(t, err, writeback.ErrRefused)
	require.ErrorContains(t, err, "(principal)")

	// The sender's proof for the reconciler's store's audience.
	_, err = store.Invoke(ctx, sign(p.sender, "reconcilestore", claim, time.Now()))
	require.ErrorIs(t, err, writeback.ErrRefused)

	// The sender's proof of a backlog read, with a claim put in its place.
	env := sign(p.sender, writeback.StoreAudience, writeback.StoreRequest{Op: writeback.OpBacklog}, time.Now())
	swapped, err := json.Marshal(claim)
	require.NoError(t, err)
	_, err = store.Invoke(ctx, invokeproof.Envelope{Payload: swapped, Proof: env.Proof})
	require.ErrorIs(t, err, writeback.ErrRefused)
	require.ErrorContains(t, err, "(forged)")

	_, err = store.Invoke(ctx, invokeproof.Envelope{Payload: swapped})
	require.ErrorIs(t, err, writeback.ErrRefused)
	require.ErrorContains(t, err, "(missing)")

	_, err = store.Invoke(ctx, sign(p.sender, writeback.StoreAudience, claim, time.Now().Add(-10*time.Minute)))
	require.ErrorIs(t, err, writeback.ErrRefused)
	require.ErrorContains(t, err, "(stale)")

	require.Equal(t, 1, b.db.Count(t, "writeback_intents", "attempts = 0 AND claim_token IS NULL"), "a refused request claimed the intent")
	require.Equal(t, 6, strings.Count(logs.String(), "write-back store request refused"))
	require.Contains(t, logs.String(), p.developer.ARN)

	// A malformed request of the sender's: refused, nothing claimed.
	_, err = store.Invoke(ctx, sign(p.sender, writeback.StoreAudience, writeback.StoreRequest{Op: writeback.OpClaim, Limit: 1000, Lease: time.Minute, KeyLifetime: time.Hour}, time.Now()))
	require.ErrorIs(t, err, writeback.ErrBadStoreRequest)
	_, err = store.Invoke(ctx, sign(p.sender, writeback.StoreAudience, writeback.StoreRequest{Op: "delete"}, time.Now()))
	require.ErrorIs(t, err, writeback.ErrBadStoreRequest)
	require.Equal(t, 1, b.db.Count(t, "writeback_intents", "attempts = 0 AND claim_token IS NULL"))

	// The sender's request: served.
	res, err := store.Invoke(ctx, sign(p.sender, writeback.StoreAudience, claim, time.Now()))
	require.NoError(t, err)
	require.Len(t, res.Intents, 1)
	require.NotEmpty(t, res.Token)
	require.Equal(t, 1, b.db.Count(t, "writeback_intents", "attempts = 1 AND claim_token IS NOT NULL"))

	var total int
	for _, line := range strings.Split(strings.TrimSpace(emf.String()), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m))
		require.Equal(t, float64(1), m["InvokeProofRefused"])
		if _, ok := m["Reason"]; !ok {
			total++
		}
	}
	require.Equal(t, 6, total)
}
