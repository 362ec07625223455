package wake_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/wake"
)

// lambdaStandIn speaks Lambda's Invoke (POST
// /2015-03-31/functions/NAME/invocations, X-Amz-Invocation-Type) and
// answers status.
type lambdaStandIn struct {
	mu     sync.Mutex
	status int
	calls  []call
}

type call struct {
	path, invocationType, payload string
	signed                        bool
}

func (s *lambdaStandIn) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.calls = append(s.calls, call{
		path: r.URL.Path, invocationType: r.Header.Get("X-Amz-Invocation-Type"), payload: string(body),
		signed: r.Header.Get("Authorization") != "",
	})
	status := s.status
	s.mu.Unlock()
	w.WriteHeader(status)
}

func client(t *testing.T, srv *httptest.Server) *lambda.Client {
	t.Helper()
	return lambda.New(lambda.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(srv.URL),
		Credentials:  credentials.NewStaticCredentialsProvider("AKIDTEST", "test", ""),
		HTTPClient:   srv.Client(),
	})
}

func TestWakeInvokesTheWorkerAsynchronously(t *testing.T) {
	t.Parallel()
	stand := &lambdaStandIn{status: http.StatusAccepted}
	srv := httptest.NewServer(stand)
	t.Cleanup(srv.Close)
	w, err := wake.NewLambda(client(t, srv), "StripeInbox-dev-worker", 0)
	require.NoError(t, err)

	require.NoError(t, w.Wake(context.Background()))
	require.Len(t, stand.calls, 1)
	got := stand.calls[0]
	require.Equal(t, "/2015-03-31/functions/StripeInbox-dev-worker/invocations", got.path)
	require.Equal(t, "Event", got.invocationType, "asynchronous: Lambda queues it and answers 202")
	require.JSONEq(t, wake.Payload, got.payload)
	require.True(t, got.signed)
}

func TestWakeReportsAThrottleOrAnError(t *testing.T) {
	t.Parallel()
	for _, status := range []int{http.StatusOK, http.StatusTooManyRequests, http.StatusInternalServerError} {
		stand := &lambdaStandIn{status: status}
		srv := httptest.NewServer(stand)
		t.Cleanup(srv.Close)
		c := lambda.New(lambda.Options{
			Region: "us-east-1", BaseEndpoint: aws.String(srv.URL), HTTPClient: srv.Client(),
			Credentials:      credentials.NewStaticCredentialsProvider("AKIDTEST", "test", ""),
			RetryMaxAttempts: 1,
		})
		w, err := wake.NewLambda(c, "worker", 0)
		require.NoError(t, err)
		err = w.Wake(context.Background())
		require.Error(t, err, "status %d", status)
		require.ErrorContains(t, err, "waking the worker (worker)")
	}
}

func TestNewLambdaRefusesWhatCannotWork(t *testing.T) {
	t.Parallel()
	_, err := wake.NewLambda(nil, "worker", 0)
	require.ErrorContains(t, err, "no Lambda client")
	_, err = wake.NewLambda(&lambda.Client{}, "", 0)
	require.ErrorContains(t, err, "no worker function")
}

func TestSignalCoalescesWakesWhileARunIsAskedFor(t *testing.T) {
	t.Parallel()
	s := wake.NewSignal()
	for range 5 {
		require.NoError(t, s.Wake(context.Background()))
	}
	<-s
	select {
	case <-s:
		t.Fatal("five wakes before the loop ran must ask for one run")
	default:
	}
	require.NoError(t, s.Wake(context.Background()))
	<-s
}
