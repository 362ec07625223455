package sqstest_test

import (
	"context"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/sqstest"
)

// The real SDK (its MD5 checks included) against the stand-in: send,
// receive, invisibility until Expire, delete, the redrive policy, errors.
func TestWithTheSDK(t *testing.T) {
	t.Parallel()
	s := sqstest.New()
	defer s.Close()
	s.CreateQueue("dlq", "", 0)
	url := s.CreateQueue("q", "dlq", 2)
	c := s.Client()
	ctx := context.Background()

	_, err := c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(url), MessageBody: aws.String(`{"a":1}`),
		MessageAttributes: map[string]types.MessageAttributeValue{"Reason": {DataType: aws.String("String"), StringValue: aws.String("x")}}})
	require.NoError(t, err)
	require.Equal(t, "x", s.Messages("q")[0].Attributes["Reason"])
	receive := func() []types.Message {
		out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(url), MaxNumberOfMessages: 10})
		require.NoError(t, err)
		return out.Messages
	}
	got := receive()
	require.Len(t, got, 1)
	require.Equal(t, `{"a":1}`, aws.ToString(got[0].Body))
	require.Empty(t, receive(), "invisible while in flight")
	s.Expire()
	got = receive()
	require.Len(t, got, 1)
	s.Expire()
	require.Empty(t, receive(), "received twice: moved to the dead-letter queue")
	require.Len(t, s.Messages("dlq"), 1)

	s.Send("q", "second")
	got = receive()
	_, err = c.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(url), ReceiptHandle: got[0].ReceiptHandle})
	require.NoError(t, err)
	require.Empty(t, s.Messages("q"))

	_, err = c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(s.QueueURL("nope"))})
	var missing *types.QueueDoesNotExist
	require.ErrorAs(t, err, &missing)
	s.Fail("ReceiveMessage", 1)
	_, err = c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(url)})
	require.ErrorContains(t, err, "scripted failure")
}
