package eventbridgetest_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	"github.com/aws/smithy-go"
	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/eventbridgetest"
)

func entries(n, detailBytes int, bus string) []types.PutEventsRequestEntry {
	out := make([]types.PutEventsRequestEntry, n)
	for i := range out {
		out[i] = types.PutEventsRequestEntry{EventBusName: aws.String(bus), Source: aws.String("s"), DetailType: aws.String("T"),
			Detail: aws.String(`{"outbox_id":` + string(rune('1'+i%9)) + `,"pad":"` + strings.Repeat("x", detailBytes) + `"}`), Time: aws.Time(time.Now())}
	}
	return out
}

func code(t *testing.T, err error) string {
	t.Helper()
	var ae smithy.APIError
	require.True(t, errors.As(err, &ae), "%v", err)
	return ae.ErrorCode()
}

// The stand-in answers the real SDK as EventBridge does: limits and a
// missing bus fail the call; faults fail entries or calls.
func TestStandInSpeaksPutEvents(t *testing.T) {
	t.Parallel()
	eb := eventbridgetest.New(t, "bus")
	c := eb.Client(func(o *eventbridge.Options) { o.RetryMaxAttempts = 1 })
	ctx := context.Background()

	out, err := c.PutEvents(ctx, &eventbridge.PutEventsInput{Entries: entries(3, 10, "bus")})
	require.NoError(t, err)
	require.EqualValues(t, 0, out.FailedEntryCount)
	require.Len(t, out.Entries, 3)
	require.NotEmpty(t, aws.ToString(out.Entries[0].EventId))
	require.Len(t, eb.Events(), 3)

	_, err = c.PutEvents(ctx, &eventbridge.PutEventsInput{Entries: entries(11, 10, "bus")})
	require.Equal(t, "ValidationException", code(t, err))
	_, err = c.PutEvents(ctx, &eventbridge.PutEventsInput{Entries: entries(3, 100*1024, "bus")})
	require.Equal(t, "ValidationException", code(t, err), "over 256 KB in total")
	_, err = c.PutEvents(ctx, &eventbridge.PutEventsInput{Entries: entries(1, 10, "other")})
	require.Equal(t, "ResourceNotFoundException", code(t, err))

	eb.FailEntries(func(e eventbridgetest.Entry) string {
		if strings.Contains(e.Detail, `"outbox_id":2`) {
			return "InternalFailure"
		}
		return ""
	})
	out, err = c.PutEvents(ctx, &eventbridge.PutEventsInput{Entries: entries(3, 10, "bus")})
	require.NoError(t, err)
	require.EqualValues(t, 1, out.FailedEntryCount)
	require.Equal(t, "InternalFailure", aws.ToString(out.Entries[1].ErrorCode))
	require.Nil(t, out.Entries[0].ErrorCode)

	eb.ThrottleCalls(1)
	_, err = c.PutEvents(ctx, &eventbridge.PutEventsInput{Entries: entries(1, 10, "bus")})
	require.Equal(t, "ThrottlingException", code(t, err))
	eb.FailCalls(1, http.StatusServiceUnavailable)
	_, err = c.PutEvents(ctx, &eventbridge.PutEventsInput{Entries: entries(1, 10, "bus")})
	require.Equal(t, "InternalException", code(t, err))

	// Only signed PutEvents calls.
	resp, err := http.Post(eb.URL, "application/x-amz-json-1.1", strings.NewReader(`{"Entries":[]}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
}
