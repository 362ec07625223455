package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/config"
	"github.com/stripe-inbox/inbox/internal/config/configtest"
	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/stripetest"
)

// The local contract of POST /_eventbridge: 200 {"outcome":"stored" or
// "duplicate"} after the commit, 400 with a message for a permanent
// refusal, 5xx for a transient failure; the worker books what it stores,
// once, whichever path brought it.
func TestLocalEventBridgeContract(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	addr := freeAddr(t)
	cfg := loadLocal(t, addr, map[string]string{
		"DATABASE_URL": db.URL, "STRIPE_WEBHOOK_SECRET": "whsec_test",
		"LOCAL_COMPONENTS": "webhook,worker", "WORKER_INTERVAL": "100ms", "POLL_INTERVAL": "0",
	})
	runUntilCleanup(t, cfg)
	post := func(path string, body []byte, header map[string]string) (int, map[string]string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			req, err := http.NewRequest(http.MethodPost, "http://"+addr+path, bytes.NewReader(body))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/json")
			for k, v := range header {
				req.Header.Set(k, v)
			}
			res, err := http.DefaultClient.Do(req)
			if err == nil {
				defer res.Body.Close()
				var out map[string]string
				_ = json.NewDecoder(res.Body).Decode(&out)
				return res.StatusCode, out
			}
			require.True(t, time.Now().Before(deadline), "the runner never listened: %v", err)
			time.Sleep(10 * time.Millisecond) // waiting for the listener
		}
	}
	paid := stripetest.Event("evt_local_eb", "invoice.paid", stripetest.Invoice("in_local_eb", "cus_1", "paid", 1500))
	code, out := post("/_eventbridge", stripetest.EventBridge("eb-1", stripetest.EventBridgeSource, paid), nil)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, map[string]string{"outcome": "stored"}, out)
	code, out = post("/_eventbridge", stripetest.EventBridge("eb-2", stripetest.EventBridgeSource, paid), nil)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, map[string]string{"outcome": "duplicate"}, out)
	code, _ = post("/billing", paid, map[string]string{"Stripe-Signature": stripetest.Sign(paid, time.Now(), "whsec_test")})
	require.Equal(t, http.StatusOK, code)

	code, out = post("/_eventbridge", stripetest.EventBridge("eb-3", "aws.partner/example.com/x", paid), nil)
	require.Equal(t, http.StatusBadRequest, code)
	require.Equal(t, "unknown_source", out["reason"])
	require.Contains(t, out["error"], `source "aws.partner/example.com/x" is not one this stage names`)
	code, out = post("/_eventbridge", stripetest.EventBridge("eb-4", stripetest.EventBridgeSource, []byte(`{"id":"cus_1","object":"customer"}`)), nil)
	require.Equal(t, http.StatusBadRequest, code)
	require.Equal(t, "not_a_stripe_event", out["reason"])

	db.WaitUntil(t, "the receipt applied", `SELECT count(*) = 1 FROM webhook_inbox WHERE processed_at IS NOT NULL AND outcome = 'applied'`)
	require.Equal(t, 1, db.Count(t, "webhook_inbox", "event_id = 'evt_local_eb' AND source = 'eventbridge'"))
	require.Equal(t, 1, db.Count(t, "ledger_entries", "invoice_id = 'in_local_eb'"))

	// A transient failure: the store statement fails (its table is
	// renamed away for a moment); the caller is told to retry.
	_, err := db.Pool.Exec(context.Background(), "ALTER TABLE webhook_inbox RENAME TO webhook_inbox_away")
	require.NoError(t, err)
	code, out = post("/_eventbridge", stripetest.EventBridge("eb-5", stripetest.EventBridgeSource,
		stripetest.Event("evt_local_eb2", "invoice.paid", stripetest.Invoice("in_2", "cus_1", "paid", 1))), nil)
	require.GreaterOrEqual(t, code, 500)
	require.Equal(t, "receipt not stored; retry", out["error"])
	_, err = db.Pool.Exec(context.Background(), "ALTER TABLE webhook_inbox_away RENAME TO webhook_inbox")
	require.NoError(t, err)
}

// EVENTBRIDGE_SOURCES replaces the default mapping, and a mistake in it
// fails the start saying what to fix.
func TestLocalEventBridgeSources(t *testing.T) {
	t.Parallel()
	base := map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1/x", "STRIPE_WEBHOOK_SECRET": "whsec_test", "LOCAL_COMPONENTS": "webhook", "WEBHOOK_ENDPOINT": "shop"}
	cfg, err := config.LoadLocal(configtest.MapEnv(base))
	require.NoError(t, err)
	require.Equal(t, "shop", cfg.EventBridge.Default)
	base["EVENTBRIDGE_SOURCES"] = "aws.partner/stripe.com/ed_a=shop, aws.partner/stripe.com/ed_b=connect"
	cfg, err = config.LoadLocal(configtest.MapEnv(base))
	require.NoError(t, err)
	require.Equal(t, map[string]string{"aws.partner/stripe.com/ed_a": "shop", "aws.partner/stripe.com/ed_b": "connect"}, cfg.EventBridge.Exact)
	require.Empty(t, cfg.EventBridge.Default)
	base["EVENTBRIDGE_SOURCES"] = "aws.events=shop,aws.partner/stripe.com/ed_a=Bad"
	_, err = config.LoadLocal(configtest.MapEnv(base))
	require.ErrorContains(t, err, `"aws.events" is not a Stripe partner event source`)
	require.ErrorContains(t, err, `"aws.partner/stripe.com/ed_a=Bad" must be source=endpoint`)
}
