package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/stripe-inbox/inbox/internal/metrics"
)

// The ingest function reads its queue itself. The stage's rule sends each
// event to an SQS queue whose policy admits only that rule
// (aws:SourceArn; https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-use-resource-based.html),
// and the function receives from it (sqs:ReceiveMessage, DeleteMessage).
// An invocation's own payload is never read: the rule's second target (a
// doorbell) and a schedule only wake the function. So a principal allowed
// lambda:InvokeFunction cannot hand it an event; only what is on the queue
// is stored, and only the rule can put it there.
//
// A message is deleted only after its receipt has committed. A transient
// failure leaves it on the queue: it comes back after the visibility
// timeout, and after the queue's maxReceiveCount the redrive policy moves
// it to the dead-letter queue. A refusal is sent to the dead-letter queue
// at once, with its reason as the message attribute Reason, and then
// deleted: never retried, never dropped silently.

// SQS is what Drain needs of the SQS client.
type SQS interface {
	ReceiveMessage(ctx context.Context, in *sqs.ReceiveMessageInput, opts ...func(*sqs.Options)) (*sqs.ReceiveMessageOutput, error)
	DeleteMessage(ctx context.Context, in *sqs.DeleteMessageInput, opts ...func(*sqs.Options)) (*sqs.DeleteMessageOutput, error)
	SendMessage(ctx context.Context, in *sqs.SendMessageInput, opts ...func(*sqs.Options)) (*sqs.SendMessageOutput, error)
}

// DrainConfig bounds one drain.
type DrainConfig struct {
	Batch          int32         // messages per ReceiveMessage, 1 to 10 (SQS's maximum)
	DeadlineMargin time.Duration // stop receiving this long before ctx's deadline
}

// Drainer empties the queue into the inbox.
type Drainer struct {
	Handler       *Handler
	SQS           SQS
	QueueURL      string
	DeadLetterURL string
	Config        DrainConfig
	Logger        *slog.Logger
	Metrics       *metrics.Emitter // may be nil
}

// Summary is what one drain did.
type Summary struct {
	Stored       int `json:"stored"`
	Duplicate    int `json:"duplicate"`
	DeadLettered int `json:"dead_lettered"`
	Failed       int `json:"failed"` // left on the queue for redelivery
}

// ErrLeftOnQueue means some messages could not be stored this time and
// were left on the queue (the invocation fails, so Errors counts it).
var ErrLeftOnQueue = errors.New("messages left on the queue for redelivery")

// Drain receives until the queue is empty or the deadline nears.
// Its input is ignored: see the comment above.
func (d *Drainer) Drain(ctx context.Context, _ any) (Summary, error) {
	var s Summary
	batch := d.Config.Batch
	if batch < 1 || batch > 10 {
		batch = 10
	}
	for {
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < d.Config.DeadlineMargin {
			break
		}
		out, err := d.SQS.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl:                    aws.String(d.QueueURL),
			MaxNumberOfMessages:         batch,
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameApproximateReceiveCount},
		})
		if err != nil {
			return s, fmt.Errorf("receiving from %s: %w", d.QueueURL, err)
		}
		if len(out.Messages) == 0 {
			break
		}
		for _, m := range out.Messages {
			d.one(ctx, m, &s)
		}
	}
	if s.Stored > 0 {
		d.Handler.wake(ctx) // once for the whole drain: every receipt has committed
	}
	d.Logger.InfoContext(ctx, "ingest drain", "summary", s)
	if s.Failed > 0 {
		return s, fmt.Errorf("%w: %d", ErrLeftOnQueue, s.Failed)
	}
	return s, nil
}

func (d *Drainer) one(ctx context.Context, m types.Message, s *Summary) {
	res, err := d.Handler.Ingest(ctx, []byte(aws.ToString(m.Body)))
	if reason := ReasonOf(err); reason != "" {
		// Permanent: to the dead-letter queue with the reason, then off
		// the queue. Should either call fail, the message stays and is
		// tried again (and refused again).
		_, err = d.SQS.SendMessage(ctx, &sqs.SendMessageInput{
			QueueUrl:    aws.String(d.DeadLetterURL),
			MessageBody: m.Body,
			MessageAttributes: map[string]types.MessageAttributeValue{
				"Reason": {DataType: aws.String("String"), StringValue: aws.String(reason)},
				"Error":  {DataType: aws.String("String"), StringValue: aws.String(truncate(err.Error(), 1024))},
			},
		})
		if err != nil {
			d.Logger.ErrorContext(ctx, "sending a refused message to the dead-letter queue", "message_id", aws.ToString(m.MessageId), "error", err)
			s.Failed++
			return
		}
		if d.delete(ctx, m) {
			s.DeadLettered++
			_ = d.Metrics.Emit(nil, metrics.Metric{Name: "IngestDeadLettered", Value: 1, Unit: metrics.Count})
		} else {
			s.Failed++
		}
		return
	}
	if err != nil {
		// Transient: left on the queue (Ingest logged it).
		s.Failed++
		return
	}
	if !d.delete(ctx, m) {
		// Committed; the redelivery will be a duplicate.
		s.Failed++
		return
	}
	if res.Outcome == Duplicate {
		s.Duplicate++
	} else {
		s.Stored++
	}
}

func (d *Drainer) delete(ctx context.Context, m types.Message) bool {
	_, err := d.SQS.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(d.QueueURL), ReceiptHandle: m.ReceiptHandle})
	if err != nil {
		d.Logger.ErrorContext(ctx, "deleting a message", "message_id", aws.ToString(m.MessageId), "error", err)
		return false
	}
	return true
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
