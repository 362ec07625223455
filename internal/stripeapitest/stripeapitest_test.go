package stripeapitest_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
	stripe "github.com/stripe/stripe-go/v82"

	"github.com/stripe-inbox/inbox/internal/stripeapitest"
	"github.com/stripe-inbox/inbox/internal/writeback"
)

// Stripe's idempotency rules as the stand-in keeps them, through stripe-go:
// a known key replays (never runs again), a known key with other
// parameters is refused, a forgotten key runs as a new request, a wrong
// API key is a 401.
func TestIdempotencySemantics(t *testing.T) {
	t.Parallel()
	s := stripeapitest.New("cus_1")
	t.Cleanup(s.Close)
	c, err := writeback.NewClient(writeback.ClientConfig{Key: stripeapitest.Key, BaseURL: s.URL})
	require.NoError(t, err)
	ctx := context.Background()

	cu, err := c.UpdateCustomerMetadata(ctx, "cus_1", map[string]string{"k": "v1"}, "key-1")
	require.NoError(t, err)
	require.Equal(t, "v1", cu.Metadata["k"])
	s.AddCustomer("cus_1", map[string]string{"k": "changed"})
	cu, err = c.UpdateCustomerMetadata(ctx, "cus_1", map[string]string{"k": "v1"}, "key-1")
	require.NoError(t, err)
	require.Equal(t, "v1", cu.Metadata["k"], "the first result, replayed")
	require.Equal(t, "changed", s.Metadata("cus_1")["k"], "not run again")
	require.Equal(t, 1, s.Applied("key-1"))
	require.True(t, s.Requests()[1].Replayed)

	_, err = c.UpdateCustomerMetadata(ctx, "cus_1", map[string]string{"k": "other"}, "key-1")
	var ce *writeback.CallError
	require.True(t, errors.As(err, &ce))
	require.Equal(t, http.StatusBadRequest, ce.Status)
	var se *stripe.Error
	require.True(t, errors.As(err, &se))
	require.Equal(t, stripe.ErrorType("idempotency_error"), se.Type)

	s.Forget()
	_, err = c.UpdateCustomerMetadata(ctx, "cus_1", map[string]string{"k": "v1"}, "key-1")
	require.NoError(t, err)
	require.Equal(t, 2, s.Applied("key-1"), "a forgotten key runs as a new request")
	require.Equal(t, "v1", s.Metadata("cus_1")["k"])

	s.Fail(stripeapitest.Fault{Status: 429, RetryAfter: "7"})
	_, err = c.GetCustomer(ctx, "cus_1")
	require.True(t, errors.As(err, &ce))
	require.Equal(t, 429, ce.Status)
	require.Equal(t, "7s", ce.RetryAfter.String())

	bad, err := writeback.NewClient(writeback.ClientConfig{Key: "sk_test_wrong", BaseURL: s.URL})
	require.NoError(t, err)
	_, err = bad.GetCustomer(ctx, "cus_1")
	require.True(t, errors.As(err, &ce))
	require.Equal(t, http.StatusUnauthorized, ce.Status)
}

// A request that was executed and then failed with a 500 saved the 500
// under its key: a retry with the key gets the 500 again, replayed, and
// runs nothing ("Subsequent requests with the same key return the same
// result, including 500 errors",
// https://docs.stripe.com/api/idempotent_requests).
func TestExecutedThen500ReplaysThe500(t *testing.T) {
	t.Parallel()
	s := stripeapitest.New("cus_1")
	t.Cleanup(s.Close)
	c, err := writeback.NewClient(writeback.ClientConfig{Key: stripeapitest.Key, BaseURL: s.URL})
	require.NoError(t, err)
	ctx := context.Background()
	s.Fail(stripeapitest.Fault{Method: http.MethodPost, ApplyThenFail: true, Status: 500})
	_, err = c.UpdateCustomerMetadata(ctx, "cus_1", map[string]string{"k": "v1"}, "key-1")
	var ce *writeback.CallError
	require.True(t, errors.As(err, &ce))
	require.Equal(t, 500, ce.Status)
	require.False(t, ce.Replayed)
	require.Equal(t, "v1", s.Metadata("cus_1")["k"], "executed")
	_, err = c.UpdateCustomerMetadata(ctx, "cus_1", map[string]string{"k": "v1"}, "key-1")
	require.True(t, errors.As(err, &ce))
	require.Equal(t, 500, ce.Status)
	require.True(t, ce.Replayed, "Idempotent-Replayed: true")
	require.Equal(t, 1, s.Applied("key-1"))
	cu, err := c.GetCustomer(ctx, "cus_1")
	require.NoError(t, err)
	require.NotEmpty(t, cu.RequestID)
}

// AnyCustomer makes an unseen customer exist; FailWith's faults apply when
// none is scripted, a scripted one first.
func TestAnyCustomerAndFailWith(t *testing.T) {
	t.Parallel()
	s := stripeapitest.New()
	t.Cleanup(s.Close)
	c, err := writeback.NewClient(writeback.ClientConfig{Key: stripeapitest.Key, BaseURL: s.URL})
	require.NoError(t, err)
	ctx := context.Background()
	var ce *writeback.CallError

	_, err = c.UpdateCustomerMetadata(ctx, "cus_new", map[string]string{"k": "v"}, "key-0")
	require.True(t, errors.As(err, &ce))
	require.Equal(t, http.StatusNotFound, ce.Status, "no such customer yet")

	s.AnyCustomer()
	draws := 0
	s.FailWith(func(string) (stripeapitest.Fault, bool) {
		draws++
		return stripeapitest.Fault{Status: 500, ApplyThenFail: true}, draws == 1
	})
	s.Fail(stripeapitest.Fault{Status: 503})
	_, err = c.UpdateCustomerMetadata(ctx, "cus_new", map[string]string{"k": "v"}, "key-1")
	require.True(t, errors.As(err, &ce))
	require.Equal(t, 503, ce.Status, "the scripted fault first")
	require.Equal(t, 0, s.Applied("key-1"))
	_, err = c.UpdateCustomerMetadata(ctx, "cus_new", map[string]string{"k": "v"}, "key-1")
	require.True(t, errors.As(err, &ce))
	require.Equal(t, 500, ce.Status, "then the drawn one: applied, then failed")
	require.Equal(t, 1, s.Applied("key-1"))
	require.Equal(t, "v", s.Metadata("cus_new")["k"])
	_, err = c.UpdateCustomerMetadata(ctx, "cus_new", map[string]string{"k": "v"}, "key-1")
	require.True(t, errors.As(err, &ce))
	require.Equal(t, 500, ce.Status, "the retry replays the saved 500, as Stripe does")
	require.True(t, ce.Replayed)
	require.Equal(t, 1, s.Applied("key-1"), "not run again")
	require.True(t, s.Requests()[len(s.Requests())-1].Replayed)
}
