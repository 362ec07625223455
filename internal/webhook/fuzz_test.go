package webhook_test

import (
	"context"
	"encoding/base64"
	"io"
	"log/slog"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/secrets"
	"github.com/stripe-inbox/inbox/internal/stripeevent"
	"github.com/stripe-inbox/inbox/internal/webhook"
)

// FuzzHandler throws arbitrary bodies and signature headers at the handler
// and checks the properties that matter: a row appears in the inbox only for
// a body whose signature verifies with the endpoint's secret, and a verified
// event within the size limit is always answered 200, whatever its content.
//
//	go test ./internal/webhook -run '^$' -fuzz FuzzHandler -fuzztime 60s
func FuzzHandler(f *testing.F) {
	db := pgtest.DB(f)
	keyring, err := secrets.NewKeyring(context.Background(), map[string]string{"billing": secretA}, secrets.Literal, secrets.Options{})
	require.NoError(f, err)
	h, err := webhook.New(db.Pool, keyring, webhook.Config{MaxBodyBytes: 4096}, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	require.NoError(f, err)

	valid := eventJSON("evt_fuzz", "invoice.paid")
	f.Add(valid, sign(valid, secretA), false)
	f.Add(valid, sign(valid, secretA), true)
	f.Add(valid, sign(valid, secretB), false)
	f.Add([]byte(`{"id":"evt_2","type":"x"}`), "t=1,v1=deadbeef", false)
	f.Add([]byte(`{}`), "", false)
	f.Add([]byte("\x00\xff"), "t=,v1=", true)
	// Text PostgreSQL's jsonb refuses: stored losslessly, never refused.
	nul := []byte(`{"id":"evt_fuzz_nul","type":"customer.updated","data":{"object":{"id":"cus_1","name":"Ann\u0000Lee"}}}`)
	f.Add(nul, sign(nul, secretA), false)
	surrogate := []byte(`{"id":"evt_fuzz_surrogate","type":"customer.updated","data":{"object":{"id":"cus_1","name":"\ud800"}}}`)
	f.Add(surrogate, sign(surrogate, secretA), false)
	f.Add(surrogate, sign(surrogate, secretA), true)

	f.Fuzz(func(t *testing.T, body []byte, header string, asBase64 bool) {
		ctx := context.Background()
		req := request("billing", body, header)
		if asBase64 {
			req.Body, req.IsBase64Encoded = base64.StdEncoding.EncodeToString(body), true
		}
		before := db.Count(t, "webhook_inbox", "")
		resp, err := h.Handle(ctx, req)
		require.NoError(t, err)
		after := db.Count(t, "webhook_inbox", "")

		_, verifyErr := stripeevent.Verify(body, header, []string{secretA})
		if verifyErr == nil && len(body) <= 4096 {
			// A verified event is never refused or failed for its content.
			require.Equal(t, http.StatusOK, resp.StatusCode, "a verified event was answered %s", resp.Body)
		}
		if resp.StatusCode == http.StatusOK {
			require.NoError(t, verifyErr, "answered 200 for a body that does not verify")
		} else {
			require.Equal(t, before, after, "a refused request stored a row (status %d)", resp.StatusCode)
		}
		if after > before {
			require.NoError(t, verifyErr, "stored a row for a body that does not verify")
			require.Equal(t, before+1, after)
		}
	})
}
