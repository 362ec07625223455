//go:build linux

package e2e_test

import (
	"context"
	"encoding/json"
	"maps"
	"net/url"
	"testing"
	"time"

	"github.com/stripe-inbox/inbox/e2e"
	"github.com/stripe-inbox/inbox/internal/invokeproof"
	"github.com/stripe-inbox/inbox/internal/invokeproof/ststest"
	"github.com/stripe-inbox/inbox/internal/pgtest"
)

// The setup the reconciler's and the write-back's scenarios share: a
// caller outside the VPC (reconcile, writeback) and its store function
// inside (reconcilestore, writebackstore), proven with the caller's role
// (internal/storecall).

// callerPrincipal is a caller function's identity in the STS stand-in: the
// environment's fake credentials (fakeAccessKey), as a session of role.
func callerPrincipal(role, session, userID string) ststest.Principal {
	return ststest.Principal{
		AccessKeyID:     fakeAccessKey,
		SecretAccessKey: "e2e-fake-secret-access-key",
		ARN:             "arn:aws:sts::" + ststest.Account + ":assumed-role/" + role + "/" + session,
		UserID:          userID,
	}
}

// provenRequest is req as a caller sends it to audience's store function:
// in an envelope with its proof, signed at at with who's credentials for
// the STS stand-in.
func provenRequest(t *testing.T, sts *ststest.Server, who ststest.Principal, audience string, req any, at time.Time) []byte {
	t.Helper()
	signer := invokeproof.NewSigner(sts.Config(who))
	signer.Now = func() time.Time { return at }
	env, err := signer.Sign(context.Background(), audience, req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// storeFunctionEnv is the environment the CDK stack gives a store
// function, with the test's database, the caller's role in roleEnv and the
// STS stand-in it verifies proofs with; extra is added.
func storeFunctionEnv(db *pgtest.Database, sts *ststest.Server, roleEnv, role string, extra map[string]string) map[string]string {
	env := map[string]string{
		"DATABASE_URL":         db.URL,
		roleEnv:                ststest.RoleARN(role),
		"AWS_ENDPOINT_URL_STS": sts.URL,
		"DB_MAX_CONNS":         "2",
		"METRICS_NAMESPACE":    "StripeInboxE2E",
		"METRICS_DIMENSIONS":   "Stage=e2e",
		"AWS_REGION":           "us-east-1",
	}
	maps.Copy(env, extra)
	return env
}

// callerEnv is the environment of a caller whose store function runs in
// store's emulator: it invokes it with the real Lambda client
// (AWS_ENDPOINT_URL_LAMBDA points at the emulator, which serves Lambda's
// Invoke path) and signs its proofs for the STS stand-in, with the fake
// credentials; extra is added (the key, STRIPE_API_BASE, the feature's
// settings).
func callerEnv(t *testing.T, store *e2e.Emulator, sts *ststest.Server, extra map[string]string) map[string]string {
	t.Helper()
	u, err := url.Parse(store.InvokeURL)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"STORE_FUNCTION":          "function", // the emulator's function name in its invoke path
		"AWS_ENDPOINT_URL_LAMBDA": "http://" + u.Host,
		"AWS_ENDPOINT_URL_STS":    sts.URL, // what it signs its proofs for
		"AWS_ACCESS_KEY_ID":       fakeAccessKey,
		"AWS_SECRET_ACCESS_KEY":   "e2e-fake-secret-access-key",
		"AWS_REGION":              "us-east-1",
		"DEADLINE_MARGIN":         "3s",
		"METRICS_NAMESPACE":       "StripeInboxE2E",
		"METRICS_DIMENSIONS":      "Stage=e2e",
	}
	maps.Copy(env, extra)
	return env
}
