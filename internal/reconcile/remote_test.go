package reconcile_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/invokeproof"
	"github.com/stripe-inbox/inbox/internal/reconcile"
)

// lambdaStandIn speaks Lambda's Invoke wire protocol
// (POST /2015-03-31/functions/{name}/invocations; a function error is a 200
// with X-Amz-Function-Error) and runs the store handler in-process; the
// first throttles requests are refused with 429 TooManyRequestsException as
// Lambda does when the function's concurrency is used up.
func lambdaStandIn(t *testing.T, h reconcile.ProvenStore, throttles int32) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		if r.Method != http.MethodPost || r.URL.Path != "/2015-03-31/functions/inbox-reconcile-store/invocations" {
			w.Header().Set("X-Amzn-Errortype", "ResourceNotFoundException")
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"Type":"User","message":"Function not found"}`)
			return
		}
		if !strings.HasPrefix(r.Header.Get("Authorization"), "AWS4-HMAC-SHA256 ") {
			w.WriteHeader(http.StatusForbidden)
			return
		}
		if n <= throttles {
			w.Header().Set("X-Amzn-Errortype", "TooManyRequestsException")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = io.WriteString(w, `{"Type":"User","message":"Rate Exceeded.","Reason":"ReservedFunctionConcurrentInvocationLimitExceeded"}`)
			return
		}
		var env invokeproof.Envelope
		body, _ := io.ReadAll(r.Body)
		res, err := func() (reconcile.StoreResponse, error) {
			if err := json.Unmarshal(body, &env); err != nil {
				return reconcile.StoreResponse{}, err
			}
			return h.Invoke(r.Context(), env)
		}()
		w.Header().Set("X-Amz-Executed-Version", "$LATEST")
		if err != nil {
			w.Header().Set("X-Amz-Function-Error", "Unhandled")
			_ = json.NewEncoder(w).Encode(map[string]string{"errorMessage": err.Error(), "errorType": "errorString"})
			return
		}
		_ = json.NewEncoder(w).Encode(res)
	}))
	t.Cleanup(srv.Close)
	return srv, &calls
}

func lambdaClient(url string) *lambda.Client {
	return lambda.New(lambda.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(url),
		Credentials:  credentials.NewStaticCredentialsProvider("AKIDTEST", "secret", ""),
	})
}

// The reconciler outside the VPC hands its pages to the store function with
// the real Lambda client: the same result as storing directly, a throttled
// invoke is retried by the SDK, and the store function refuses an endpoint
// it does not reconcile.
func TestRemoteSinkThroughLambdaInvoke(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 30 {
		b.api.Add(event(fmt.Sprintf("evt_%02d", i), "invoice.paid", time.Duration(i+2)*time.Minute+reconcile.DefaultSettle))
	}
	b.deliver(t, event("evt_05", "invoice.paid", 7*time.Minute+reconcile.DefaultSettle))
	p := newProofs(t)
	store := reconcile.StoreHandler{Sink: reconcile.DBSink{DB: b.db.Pool}, Endpoints: []string{"billing"}, Now: func() time.Time { return now }}
	srv, calls := lambdaStandIn(t, reconcile.ProvenStore{Store: store, Proofs: p.verifier}, 1)
	sink := reconcile.RemoteSink{Lambda: lambdaClient(srv.URL), Function: "inbox-reconcile-store", Prover: p.signer(p.reconciler)}

	cfg := reconcile.Config{Endpoint: "billing", Types: handlerTypes(), PageLimit: 10, Slice: reconcile.DefaultLookback, Lookback: 2 * time.Hour}.WithDefaults()
	r, err := reconcile.New(sink, b.client(t, 1), cfg, nil, nil)
	require.NoError(t, err)
	r.Now = func() time.Time { return now }
	s, err := r.Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, 29, s.Stored)
	require.Equal(t, 1, s.AlreadyPresent)
	require.Equal(t, 30, b.db.Count(t, "webhook_inbox", ""))
	// 1 throttled + high_water + 4 pages (2 events found by the probe,
	// then 10, 10 and 8, oldest first), each followed by an advance.
	require.EqualValues(t, 10, calls.Load())
	hw, ok := b.highWater(t)
	require.True(t, ok)
	require.Equal(t, now.Add(-reconcile.DefaultSettle), hw.UTC())

	// The next run reads the mark through the store function.
	got, ok, err := sink.HighWater(context.Background(), "billing")
	require.NoError(t, err)
	require.True(t, ok)
	require.True(t, got.Equal(hw))

	_, err = sink.StorePage(context.Background(), "connect", []json.RawMessage{event("evt_x", "invoice.paid", time.Hour)})
	require.ErrorContains(t, err, `endpoint \"connect\" is not reconciled here`)
	err = sink.Advance(context.Background(), "billing", now.Add(24*time.Hour))
	require.ErrorContains(t, err, "must be a time not in the future")
}
