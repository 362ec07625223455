package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/config"
	"github.com/stripe-inbox/inbox/internal/config/configtest"
	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/reconcile"
	"github.com/stripe-inbox/inbox/internal/reconcile/fakeapi"
	"github.com/stripe-inbox/inbox/internal/stripeevent"
	"github.com/stripe-inbox/inbox/internal/stripetest"
)

func recent(id, typ string, ago time.Duration) []byte {
	return stripetest.EventWith(id, typ, stripetest.Meta{Created: time.Now().Add(-ago).Unix()}, stripetest.Invoice("in_"+id, "cus_1", "paid", 100))
}

// A local backfill stores what is missing and, run again, nothing; the
// high-water mark of the scheduled reconciler is not touched.
func TestLocalBackfillIsIdempotent(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	api := fakeapi.New("")
	t.Cleanup(api.Close)
	for i := range 120 {
		// Created 5 to 54 minutes ago (i < 50) or 65 to 134 minutes ago:
		// minutes from the settle window's end (an hour), whatever the
		// machine's speed.
		age := time.Duration(i+5) * time.Minute
		if i >= 50 {
			age += 10 * time.Minute
		}
		raw := recent(fmt.Sprintf("evt_%03d", i), "invoice.paid", age)
		api.Add(raw)
		if i%4 == 0 {
			ev, err := stripeevent.Parse(raw)
			require.NoError(t, err)
			_, err = inbox.Store(context.Background(), db.Pool, "billing", ev)
			require.NoError(t, err)
		}
	}
	api.Add(recent("evt_voided", "invoice.voided", 30*time.Minute))
	env := configtest.MapEnv(map[string]string{"STRIPE_API_KEY": fakeapi.Key, "STRIPE_API_BASE": api.URL, "DATABASE_URL": db.URL, "RECONCILE_RATE": "100"})

	var out, errOut bytes.Buffer
	require.NoError(t, run(context.Background(), []string{"--since", "3h", "--types", "invoice.paid"}, env, &out, &errOut))
	// 50 events are younger than the settle window (an hour): stored, not
	// counted as missing; 13 of them and 17 older ones were delivered.
	require.Contains(t, out.String(), "120 events listed, 53 stored (missing), 30 already present, "+
		"37 stored younger than the settle window (Stripe may still deliver them; not counted as missing); stored by type {\"invoice.paid\":53}")
	require.Equal(t, 120, db.Count(t, "webhook_inbox", ""))

	out.Reset()
	require.NoError(t, run(context.Background(), []string{"--since", "3h"}, env, &out, &errOut))
	require.Contains(t, out.String(), "121 events listed, 0 stored (missing), 120 already present, 1 stored younger than the settle window")
	_, ok, err := inbox.HighWater(context.Background(), db.Pool, "billing")
	require.NoError(t, err)
	require.False(t, ok, "a backfill leaves the mark alone")

	err = run(context.Background(), []string{"--since", "3h", "--types", "customer.created"}, env, &out, &errOut)
	require.ErrorContains(t, err, `type "customer.created" has no handler`)
	err = run(context.Background(), []string{"--since", "yesterday"}, env, &out, &errOut)
	require.ErrorContains(t, err, "--since")
	err = run(context.Background(), []string{"--since", "1h", "--until", "2h"}, env, &out, &errOut)
	require.ErrorContains(t, err, "is not before")
}

// invoker runs the reconciler function's handler in-process.
type invoker struct {
	r     *reconcile.Reconciler
	calls []reconcile.Invocation
}

func (i *invoker) Invoke(ctx context.Context, in *lambda.InvokeInput, _ ...func(*lambda.Options)) (*lambda.InvokeOutput, error) {
	var inv reconcile.Invocation
	if err := json.Unmarshal(in.Payload, &inv); err != nil {
		return nil, err
	}
	i.calls = append(i.calls, inv)
	s, err := i.r.Invoke(ctx, inv)
	if err != nil {
		return &lambda.InvokeOutput{FunctionError: new("Unhandled"), Payload: []byte(`{"errorMessage":"` + err.Error() + `"}`)}, nil
	}
	b, _ := json.Marshal(s)
	return &lambda.InvokeOutput{Payload: b}, nil
}

// --stage sends the window in slices, one invocation each, and adds up
// their summaries.
func TestStageBackfillInvokesPerSlice(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	api := fakeapi.New("")
	t.Cleanup(api.Close)
	for i := range 30 {
		api.Add(recent(fmt.Sprintf("evt_%02d", i), "invoice.paid", time.Duration(i)*10*time.Minute+5*time.Minute))
	}
	client, err := reconcile.NewClient(reconcile.ClientConfig{Key: fakeapi.Key, BaseURL: api.URL, Rate: 100})
	require.NoError(t, err)
	cfg := reconcile.Config{Endpoint: "billing", Types: config.HandlerTypes()}.WithDefaults()
	r, err := reconcile.New(reconcile.DBSink{DB: db.Pool}, client, cfg, nil, nil)
	require.NoError(t, err)
	inv := &invoker{r: r}
	now := time.Now()
	total, err := invokeSlices(context.Background(), inv, FunctionName("dev"), now.Add(-6*time.Hour), now, nil, 2*time.Hour, newProgress(&bytes.Buffer{}))
	require.NoError(t, err)
	require.Len(t, inv.calls, 3)
	require.Equal(t, 24, total.Stored)
	require.Equal(t, 6, total.StoredUnsettled, "created less than the settle window (an hour) ago")
	require.Equal(t, 30, db.Count(t, "webhook_inbox", "source = 'reconcile'"))
	require.Equal(t, "StripeInbox-dev-reconcile", FunctionName("dev"))
}
