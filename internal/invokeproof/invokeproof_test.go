package invokeproof_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/invokeproof"
	"github.com/stripe-inbox/inbox/internal/invokeproof/ststest"
)

const audience = "reconcilestore"

type bundle struct {
	sts        *ststest.Server
	reconciler ststest.Principal
	other      ststest.Principal
	verifier   *invokeproof.Verifier
}

func setup(t *testing.T) bundle {
	t.Helper()
	b := bundle{
		reconciler: ststest.RoleSession("StripeInbox-dev-ReconcileRole", "StripeInbox-dev-reconcile", "ASIARECONCILE"),
		other:      ststest.RoleSession("Developer", "alice", "ASIADEVELOPER"),
	}
	b.sts = ststest.New(t, b.reconciler, b.other)
	admit, err := invokeproof.Role(ststest.RoleARN("StripeInbox-dev-ReconcileRole"))
	require.NoError(t, err)
	u, err := url.Parse(b.sts.URL + "/")
	require.NoError(t, err)
	b.verifier, err = invokeproof.NewVerifier(u, admit, nil)
	require.NoError(t, err)
	return b
}

func (b bundle) sign(t *testing.T, p ststest.Principal, payload any) invokeproof.Envelope {
	t.Helper()
	env, err := invokeproof.NewSigner(b.sts.Config(p)).Sign(context.Background(), audience, payload)
	require.NoError(t, err)
	// As it travels: JSON through Lambda's Invoke.
	raw, err := json.Marshal(env)
	require.NoError(t, err)
	var got invokeproof.Envelope
	require.NoError(t, json.Unmarshal(raw, &got))
	return got
}

type page struct {
	Op     string   `json:"op"`
	Events []string `json:"events"`
}

func TestTheReconcilersProofIsAdmitted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	env := b.sign(t, b.reconciler, page{Op: "store", Events: []string{"evt_1"}})
	require.Equal(t, "host;x-inbox-invoke-proof", env.Proof.SignedHeaders)
	require.NotEmpty(t, env.Proof.SecurityToken)

	payload, id, err := b.verifier.Open(context.Background(), audience, env)
	require.NoError(t, err)
	require.Equal(t, b.reconciler.ARN, id.ARN)
	require.Equal(t, ststest.Account, id.Account)
	require.JSONEq(t, `{"op":"store","events":["evt_1"]}`, string(payload))
	require.Equal(t, 1, b.sts.Calls())
}

func TestAChangedPayloadOrAudienceIsForged(t *testing.T) {
	t.Parallel()
	b := setup(t)
	env := b.sign(t, b.reconciler, page{Op: "store", Events: []string{"evt_1"}})

	_, err := b.verifier.Verify(context.Background(), audience, []byte(`{"op":"store","events":["evt_2"]}`), env.Proof)
	require.ErrorIs(t, err, invokeproof.ErrForged)
	require.Equal(t, "forged", invokeproof.Reason(err))
	require.Contains(t, err.Error(), "SignatureDoesNotMatch")

	// The same bytes for another kind of request (a write-back function's
	// proof replayed to the store, or the other way round).
	_, err = b.verifier.Verify(context.Background(), "writeback", env.Payload, env.Proof)
	require.ErrorIs(t, err, invokeproof.ErrForged)
}

func TestAMadeUpSignatureIsForged(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// The reconciler's access key with a guessed secret.
	guess := b.reconciler
	guess.SecretAccessKey = "not-the-secret"
	env, err := invokeproof.NewSigner(b.sts.Config(guess)).Sign(context.Background(), audience, page{Op: "store"})
	require.NoError(t, err)
	_, _, err = b.verifier.Open(context.Background(), audience, env)
	require.ErrorIs(t, err, invokeproof.ErrForged)

	// A key STS does not know.
	stranger := ststest.RoleSession("StripeInbox-dev-ReconcileRole", "x", "ASIAUNKNOWN")
	env, err = invokeproof.NewSigner(b.sts.Config(stranger)).Sign(context.Background(), audience, page{Op: "store"})
	require.NoError(t, err)
	_, _, err = b.verifier.Open(context.Background(), audience, env)
	require.ErrorIs(t, err, invokeproof.ErrForged)
	require.Contains(t, err.Error(), "InvalidClientTokenId")

	// The signature of a genuine proof, altered.
	env = b.sign(t, b.reconciler, page{Op: "store"})
	flipped := "0"
	if env.Proof.Signature[0] == '0' {
		flipped = "1"
	}
	env.Proof.Signature = flipped + env.Proof.Signature[1:]
	_, _, err = b.verifier.Open(context.Background(), audience, env)
	require.ErrorIs(t, err, invokeproof.ErrForged)
}

func TestAnOldOrReplayedProofIsStale(t *testing.T) {
	t.Parallel()
	b := setup(t)
	env := b.sign(t, b.reconciler, page{Op: "advance"})
	calls := b.sts.Calls()

	// Presented again six minutes later: refused before STS is asked.
	b.verifier.Now = func() time.Time { return time.Now().Add(6 * time.Minute) }
	_, _, err := b.verifier.Open(context.Background(), audience, env)
	require.ErrorIs(t, err, invokeproof.ErrStale)
	require.Equal(t, "stale", invokeproof.Reason(err))
	require.Equal(t, calls, b.sts.Calls(), "a stale proof must not reach STS")

	// Signed ten minutes ago (a captured request, or a sender's clock off).
	b.verifier.Now = time.Now
	s := invokeproof.NewSigner(b.sts.Config(b.reconciler))
	s.Now = func() time.Time { return time.Now().Add(-10 * time.Minute) }
	old, err := s.Sign(context.Background(), audience, page{Op: "advance"})
	require.NoError(t, err)
	_, _, err = b.verifier.Open(context.Background(), audience, old)
	require.ErrorIs(t, err, invokeproof.ErrStale)

	// Dated in the future.
	s.Now = func() time.Time { return time.Now().Add(10 * time.Minute) }
	ahead, err := s.Sign(context.Background(), audience, page{Op: "advance"})
	require.NoError(t, err)
	_, _, err = b.verifier.Open(context.Background(), audience, ahead)
	require.ErrorIs(t, err, invokeproof.ErrStale)

	// Within the window by this function's clock but expired by STS's:
	// STS refuses, and that is a refusal too.
	b.sts.Now = func() time.Time { return time.Now().Add(16 * time.Minute) }
	_, _, err = b.verifier.Open(context.Background(), audience, env)
	require.ErrorIs(t, err, invokeproof.ErrForged)
	require.Contains(t, err.Error(), "Signature expired")
}

func TestAnotherPrincipalIsNotAdmitted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A developer whose role may invoke every function: a genuine proof,
	// of the wrong principal.
	env := b.sign(t, b.other, page{Op: "store"})
	_, id, err := b.verifier.Open(context.Background(), audience, env)
	require.ErrorIs(t, err, invokeproof.ErrNotAdmitted)
	require.Equal(t, "principal", invokeproof.Reason(err))
	require.Empty(t, id.ARN, "Open returns no identity with a refusal")
	id, err = b.verifier.Verify(context.Background(), audience, env.Payload, env.Proof)
	require.ErrorIs(t, err, invokeproof.ErrNotAdmitted)
	require.Equal(t, b.other.ARN, id.ARN, "Verify says who was refused")

	// Admitting the account instead admits it.
	admit, err := invokeproof.Account(ststest.Account)
	require.NoError(t, err)
	u, _ := url.Parse(b.sts.URL + "/")
	v, err := invokeproof.NewVerifier(u, admit, nil)
	require.NoError(t, err)
	id, err = v.Verify(context.Background(), audience, env.Payload, env.Proof)
	require.NoError(t, err)
	require.Equal(t, b.other.ARN, id.ARN)

	other, err := invokeproof.Account("210987654321")
	require.NoError(t, err)
	v, err = invokeproof.NewVerifier(u, other, nil)
	require.NoError(t, err)
	_, err = v.Verify(context.Background(), audience, env.Payload, env.Proof)
	require.ErrorIs(t, err, invokeproof.ErrNotAdmitted)
}

func TestMalformedProofsAreRefusedWithoutAskingSTS(t *testing.T) {
	t.Parallel()
	b := setup(t)
	good := b.sign(t, b.reconciler, page{Op: "store"})
	calls := b.sts.Calls()
	for name, change := range map[string]func(p *invokeproof.Proof){
		"version":       func(p *invokeproof.Proof) { p.Version = 2 },
		"host":          func(p *invokeproof.Proof) { p.Host = "sts.evil.example" },
		"date":          func(p *invokeproof.Proof) { p.Date = "yesterday" },
		"expires":       func(p *invokeproof.Proof) { p.Expires = "86400" },
		"credential":    func(p *invokeproof.Proof) { p.Credential += "&Action=AssumeRole" },
		"service":       func(p *invokeproof.Proof) { p.Credential = strings.Replace(p.Credential, "/sts/", "/s3/", 1) },
		"unsigned":      func(p *invokeproof.Proof) { p.SignedHeaders = "host" },
		"more headers":  func(p *invokeproof.Proof) { p.SignedHeaders += ";x-amz-date" },
		"signature":     func(p *invokeproof.Proof) { p.Signature = "abc" },
		"huge token":    func(p *invokeproof.Proof) { p.SecurityToken = strings.Repeat("t", 10000) },
		"token escapes": func(p *invokeproof.Proof) { p.Signature = strings.Repeat("0", 63) + "&" },
	} {
		p := *good.Proof
		change(&p)
		_, err := b.verifier.Verify(context.Background(), audience, good.Payload, &p)
		require.ErrorIs(t, err, invokeproof.ErrMalformed, name)
	}
	_, err := b.verifier.Verify(context.Background(), audience, good.Payload, nil)
	require.ErrorIs(t, err, invokeproof.ErrNoProof)
	require.Equal(t, "missing", invokeproof.Reason(err))
	_, err = b.verifier.Verify(context.Background(), audience, nil, good.Proof)
	require.ErrorIs(t, err, invokeproof.ErrMalformed)
	require.Equal(t, calls, b.sts.Calls())
}

func TestSTSFailingIsNotARefusal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	env := b.sign(t, b.reconciler, page{Op: "store"})
	b.sts.Fail(1, 500, "InternalFailure")
	_, _, err := b.verifier.Open(context.Background(), audience, env)
	require.Error(t, err)
	require.False(t, invokeproof.Refused(err), "an STS outage is not the sender's fault: %v", err)
	b.sts.Fail(1, 400, "Throttling")
	_, _, err = b.verifier.Open(context.Background(), audience, env)
	require.Error(t, err)
	require.False(t, invokeproof.Refused(err))
	// Then it answers.
	_, _, err = b.verifier.Open(context.Background(), audience, env)
	require.NoError(t, err)

	// A call STS holds ends with the caller's context.
	b.sts.Hold()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, _, err := b.verifier.Open(ctx, audience, env); done <- err }()
	cancel()
	err = <-done
	require.Error(t, err)
	require.False(t, invokeproof.Refused(err))
	require.True(t, errors.Is(err, context.Canceled), "%v", err)
}

func TestRoleAndAccountParseARNs(t *testing.T) {
	t.Parallel()
	admit, err := invokeproof.Role("arn:aws:iam::123456789012:role/service-role/StripeInbox-ReconcileRole")
	require.NoError(t, err)
	require.NoError(t, admit(invokeproof.Identity{ARN: "arn:aws:sts::123456789012:assumed-role/StripeInbox-ReconcileRole/fn", Account: "123456789012"}))
	require.ErrorIs(t, admit(invokeproof.Identity{ARN: "arn:aws:sts::123456789012:assumed-role/StripeInbox-ReconcileRole2/fn", Account: "123456789012"}), invokeproof.ErrNotAdmitted)
	require.ErrorIs(t, admit(invokeproof.Identity{ARN: "arn:aws:sts::999999999999:assumed-role/StripeInbox-ReconcileRole/fn", Account: "999999999999"}), invokeproof.ErrNotAdmitted)
	require.ErrorIs(t, admit(invokeproof.Identity{ARN: "arn:aws:iam::123456789012:user/StripeInbox-ReconcileRole", Account: "123456789012"}), invokeproof.ErrNotAdmitted)
	for _, bad := range []string{"", "StripeInbox-ReconcileRole", "arn:aws:iam::123456789012:user/x", "arn:aws:sts::123456789012:assumed-role/x/y", "arn:aws:iam::123:role/x"} {
		_, err := invokeproof.Role(bad)
		require.Error(t, err, bad)
	}
	_, err = invokeproof.Account("12345")
	require.Error(t, err)

	name, session, ok := invokeproof.Identity{ARN: "arn:aws-us-gov:sts::123456789012:assumed-role/Admin/alice@example.com"}.Role()
	require.True(t, ok)
	require.Equal(t, "Admin", name)
	require.Equal(t, "alice@example.com", session)
	_, _, ok = invokeproof.Identity{ARN: "arn:aws:iam::123456789012:user/alice"}.Role()
	require.False(t, ok)
}

func TestTheVerifierCallsSTSOnlyOverTLS(t *testing.T) {
	t.Parallel()
	admit, err := invokeproof.Account(ststest.Account)
	require.NoError(t, err)
	for _, ok := range []string{"https://sts.us-east-1.amazonaws.com/", "http://127.0.0.1:4566/", "http://[::1]:1/", "http://localhost:1/"} {
		u, _ := url.Parse(ok)
		_, err := invokeproof.NewVerifier(u, admit, nil)
		require.NoError(t, err, ok)
	}
	for _, bad := range []string{"http://sts.us-east-1.amazonaws.com/", "ftp://127.0.0.1/"} {
		u, _ := url.Parse(bad)
		_, err := invokeproof.NewVerifier(u, admit, nil)
		require.Error(t, err, bad)
	}
}

func TestEndpointIsWhatTheSDKResolves(t *testing.T) {
	t.Parallel()
	b := setup(t)
	u, err := invokeproof.Endpoint(context.Background(), b.sts.Config(b.reconciler))
	require.NoError(t, err)
	require.Equal(t, b.sts.URL+"/", u.String())
	env := b.sign(t, b.reconciler, page{Op: "store"})
	require.Equal(t, u.Host, env.Proof.Host)
}
