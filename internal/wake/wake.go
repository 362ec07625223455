// Package wake starts a worker run as soon as a receipt commits, so that a
// worker need not be resident (polling) to apply receipts within a second.
//
// The webhook, after its INSERT committed a new receipt (stored, or a
// delivery that replaced the reconciler's listed copy; never a duplicate),
// calls Wake. On AWS that is a Lambda Invoke of the worker with
// InvocationType Event: Lambda queues the event and answers 202 at once, so
// the webhook's answer to Stripe waits for one API round trip (bounded by
// Timeout), never for the worker. The worker drains the inbox until a claim
// comes back empty and exits; the 1-minute schedule stays as the safety
// net for a wake that was lost (the Invoke failed, or the queued event
// outlived its maximum age).
//
// What bounds a burst: the worker's reserved concurrency (the stack's
// workerReservedConcurrency, 3). A thousand deliveries in a second queue a
// thousand events, but at most three workers run at once; Lambda holds the
// rest in its asynchronous queue and retries them as runs end (throttled
// asynchronous invocations are retried, not dropped, for up to the event's
// maximum age, one minute here:
// https://docs.aws.amazon.com/lambda/latest/dg/invocation-async-error-handling.html).
// Those later runs find the inbox drained and exit after one empty claim,
// so a burst costs requests ($0.20 per million) and a few milliseconds each,
// not database connections. A wake is not coalesced in the webhook: a
// receipt committed after a running worker's last empty claim must start a
// run of its own, or it would wait for the schedule.
package wake

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/lambda/types"
)

// DefaultTimeout bounds one Invoke: the webhook answers Stripe after it.
const DefaultTimeout = time.Second

// Payload is the event the worker receives: shaped as an EventBridge event
// (the worker's handler takes one), from this source.
const Payload = `{"source":"stripe-inbox.webhook","detail-type":"Wake","detail":{}}`

// Invoker is the Lambda API call Lambda uses (*lambda.Client).
type Invoker interface {
	Invoke(ctx context.Context, in *lambda.InvokeInput, optFns ...func(*lambda.Options)) (*lambda.InvokeOutput, error)
}

// Lambda wakes a worker function with an asynchronous Invoke.
type Lambda struct {
	client   Invoker
	function string
	timeout  time.Duration
}

// NewLambda wakes function (a name or ARN) through client; timeout 0 means
// DefaultTimeout.
func NewLambda(client Invoker, function string, timeout time.Duration) (*Lambda, error) {
	if client == nil {
		return nil, errors.New("wake: no Lambda client")
	}
	if function == "" {
		return nil, errors.New("wake: no worker function named")
	}
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	return &Lambda{client: client, function: function, timeout: timeout}, nil
}

// Wake queues one worker run. Lambda answers 202 when it has queued the
// event; anything else is an error (the schedule then picks the receipt
// up).
func (l *Lambda) Wake(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	out, err := l.client.Invoke(ctx, &lambda.InvokeInput{
		FunctionName:   aws.String(l.function),
		InvocationType: types.InvocationTypeEvent,
		Payload:        []byte(Payload),
	})
	if err != nil {
		return fmt.Errorf("waking the worker (%s): %w", l.function, err)
	}
	if out.StatusCode != 202 {
		return fmt.Errorf("waking the worker (%s): Lambda answered %d, want 202", l.function, out.StatusCode)
	}
	return nil
}

// Signal wakes a worker loop in the same process (the local runner): a
// send that never blocks on a channel of capacity 1, so any number of
// wakes while a run is under way make exactly one more run.
type Signal chan struct{}

// NewSignal returns a Signal; the loop receives from it.
func NewSignal() Signal { return make(Signal, 1) }

// Wake asks for one more run.
func (s Signal) Wake(context.Context) error {
	select {
	case s <- struct{}{}:
	default: // a run is already asked for
	}
	return nil
}
