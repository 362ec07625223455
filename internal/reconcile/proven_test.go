package reconcile_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/invokeproof"
	"github.com/stripe-inbox/inbox/internal/invokeproof/ststest"
	"github.com/stripe-inbox/inbox/internal/metrics"
	"github.com/stripe-inbox/inbox/internal/reconcile"
	"github.com/stripe-inbox/inbox/internal/stripetest"
)

// proofs is an STS stand-in that knows the reconciler's role session and a
// developer's, and a verifier that admits the reconciler's role only.
type proofs struct {
	sts        *ststest.Server
	reconciler ststest.Principal
	developer  ststest.Principal
	verifier   *invokeproof.Verifier
}

const reconcileRole = "StripeInbox-dev-ReconcileFunctionServiceRole"

func newProofs(t *testing.T) proofs {
	t.Helper()
	p := proofs{
		reconciler: ststest.RoleSession(reconcileRole, "StripeInbox-dev-reconcile", "ASIARECONCILER"),
		developer:  ststest.RoleSession("Developer", "dev@example.com", "ASIADEVELOPER"),
	}
	p.sts = ststest.New(t, p.reconciler, p.developer)
	admit, err := invokeproof.Role(ststest.RoleARN(reconcileRole))
	require.NoError(t, err)
	u, err := url.Parse(p.sts.URL + "/")
	require.NoError(t, err)
	p.verifier, err = invokeproof.NewVerifier(u, admit, nil)
	require.NoError(t, err)
	return p
}

func (p proofs) signer(who ststest.Principal) *invokeproof.Signer {
	return invokeproof.NewSigner(p.sts.Config(who))
}

// TestTheStoreFunctionStoresOnlyTheReconcilersRequests: the store function's
// handler, on a real database, given a forged request (a developer's
// genuine credentials, an invoice.paid of their making), one with a
// made-up proof, one without any, the reconciler's request replayed after
// the window and the reconciler's request itself: only the last stores,
// and each refusal is counted by reason.
func TestTheStoreFunctionStoresOnlyTheReconcilersRequests(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := newProofs(t)
	var emf, logs bytes.Buffer
	store := reconcile.ProvenStore{
		Store:   reconcile.StoreHandler{Sink: reconcile.DBSink{DB: b.db.Pool}, Endpoints: []string{"billing"}, Now: func() time.Time { return now }},
		Proofs:  p.verifier,
		Metrics: metrics.New(&emf, "Test", map[string]string{"Service": "reconcilestore"}),
		Logger:  slog.New(slog.NewJSONHandler(&logs, nil)),
	}
	paid := func(id string) reconcile.StoreRequest {
		return reconcile.StoreRequest{Op: reconcile.OpStore, Endpoint: "billing", Events: []json.RawMessage{
			stripetest.Event(id, "invoice.paid", stripetest.Invoice("in_"+id, "cus_1", "paid", 500000)),
		}}
	}
	sign := func(who ststest.Principal, req reconcile.StoreRequest, at time.Time) invokeproof.Envelope {
		s := p.signer(who)
		s.Now = func() time.Time { return at }
		env, err := s.Sign(context.Background(), reconcile.StoreAudience, req)
		require.NoError(t, err)
		return env
	}
	ctx := context.Background()

	// A developer with lambda:InvokeFunction on "*": their own, genuine
	// proof.
	_, err := store.Invoke(ctx, sign(p.developer, paid("evt_forged"), time.Now()))
	require.ErrorIs(t, err, reconcile.ErrRefused)
	require.ErrorContains(t, err, "(principal)")

	// The reconciler's proof, with the page swapped for another.
	env := sign(p.reconciler, paid("evt_real"), time.Now())
	forged, err := json.Marshal(paid("evt_swapped"))
	require.NoError(t, err)
	_, err = store.Invoke(ctx, invokeproof.Envelope{Payload: forged, Proof: env.Proof})
	require.ErrorIs(t, err, reconcile.ErrRefused)
	require.ErrorContains(t, err, "(forged)")

	// No proof: the request format before this release, or a hand-made
	// invocation.
	_, err = store.Invoke(ctx, invokeproof.Envelope{Payload: forged})
	require.ErrorIs(t, err, reconcile.ErrRefused)
	require.ErrorContains(t, err, "(missing)")

	// The reconciler's genuine request, replayed ten minutes later (an
	// advance that would hide everything after its mark is the dangerous
	// one: its To is what the reconciler sent, never moved further).
	old := sign(p.reconciler, reconcile.StoreRequest{Op: reconcile.OpAdvance, Endpoint: "billing", To: now.Add(-time.Minute)}, time.Now().Add(-10*time.Minute))
	_, err = store.Invoke(ctx, old)
	require.ErrorIs(t, err, reconcile.ErrRefused)
	require.ErrorContains(t, err, "(stale)")

	require.Zero(t, b.db.Count(t, "webhook_inbox", ""), "a refused request stored something")
	require.Zero(t, b.db.Count(t, "reconcile_high_water", ""), "a refused request moved the mark")

	// The reconciler's request, now: stored.
	res, err := store.Invoke(ctx, env)
	require.NoError(t, err)
	require.Equal(t, 1, res.Counts.Stored)
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "event_id = 'evt_real' AND source = 'reconcile'"))
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", ""))

	// Each refusal counted once in total and once by reason; the log says
	// why.
	var total int
	byReason := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(emf.String()), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m))
		require.Equal(t, float64(1), m["InvokeProofRefused"])
		if r, ok := m["Reason"].(string); ok {
			byReason[r]++
		} else {
			total++
		}
	}
	require.Equal(t, 4, total)
	require.Equal(t, map[string]int{"principal": 1, "forged": 1, "missing": 1, "stale": 1}, byReason)
	require.Equal(t, 4, strings.Count(logs.String(), "store request refused"))
	require.Contains(t, logs.String(), p.developer.ARN)
}

// TestTheStoreFunctionFailsWhenSTSCannotBeAsked: an STS outage fails the
// invocation (the reconciler's run fails and is retried by the next one)
// without counting a refusal or storing anything.
func TestTheStoreFunctionFailsWhenSTSCannotBeAsked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := newProofs(t)
	var emf bytes.Buffer
	store := reconcile.ProvenStore{
		Store:   reconcile.StoreHandler{Sink: reconcile.DBSink{DB: b.db.Pool}, Endpoints: []string{"billing"}},
		Proofs:  p.verifier,
		Metrics: metrics.New(&emf, "Test", nil),
	}
	env, err := p.signer(p.reconciler).Sign(context.Background(), reconcile.StoreAudience, reconcile.StoreRequest{Op: reconcile.OpHighWater, Endpoint: "billing"})
	require.NoError(t, err)
	p.sts.Fail(1, 503, "ServiceUnavailable")
	_, err = store.Invoke(context.Background(), env)
	require.Error(t, err)
	require.NotErrorIs(t, err, reconcile.ErrRefused)
	require.Empty(t, emf.String())
	// STS back: the same request is served.
	_, err = store.Invoke(context.Background(), env)
	require.NoError(t, err)
}
