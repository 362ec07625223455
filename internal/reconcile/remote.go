package reconcile

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/lambda/types"

	"github.com/stripe-inbox/inbox/internal/storecall"
)

// Invoker is the part of the Lambda client RemoteSink uses
// (storecall.Invoker).
type Invoker = storecall.Invoker

// MaxInvokeBytes keeps a store request under Lambda's 6 MB synchronous
// payload quota (https://docs.aws.amazon.com/lambda/latest/dg/gettingstarted-limits.html),
// with room for the envelope.
const MaxInvokeBytes = 5 << 20

// RemoteSink is the Sink of the reconciler outside the VPC: every call is a
// synchronous, IAM-authorized Invoke of the store function inside the VPC
// (storecall.Call). A page too large for one payload is sent in several
// requests.
type RemoteSink struct {
	Lambda   Invoker
	Function string // the store function's name or ARN
	// Prover proves each request as the reconciler's (invokeproof.Signer,
	// with the function's role credentials): the store function refuses
	// any request without it.
	Prover Prover
}

// Prover signs a request (invokeproof.Signer).
type Prover = storecall.Prover

func (r RemoteSink) call(ctx context.Context, req StoreRequest) (StoreResponse, error) {
	return storecall.Call[StoreResponse](ctx, storecall.Caller{
		Lambda: r.Lambda, Function: r.Function, Prover: r.Prover, Audience: StoreAudience,
		Name: "the store function", Sender: "the reconciler",
	}, req.Op, req)
}

// HighWater asks the store function for the endpoint's mark.
func (r RemoteSink) HighWater(ctx context.Context, endpoint string) (time.Time, bool, error) {
	res, err := r.call(ctx, StoreRequest{Op: OpHighWater, Endpoint: endpoint})
	if err != nil || res.HighWater == nil {
		return time.Time{}, false, err
	}
	return *res.HighWater, true, nil
}

// StorePage hands the page to the store function, split so that each
// request fits the payload quota.
func (r RemoteSink) StorePage(ctx context.Context, endpoint string, events []json.RawMessage) (Counts, error) {
	var total Counts
	for len(events) > 0 {
		n, size := 0, 0
		for n < len(events) && (n == 0 || size+len(events[n]) < MaxInvokeBytes) {
			size += len(events[n]) + 1
			n++
		}
		if size > MaxInvokeBytes {
			return total, fmt.Errorf("event larger than a Lambda payload (%d bytes)", size)
		}
		res, err := r.call(ctx, StoreRequest{Op: OpStore, Endpoint: endpoint, Events: events[:n]})
		if err != nil {
			return total, err
		}
		if res.Counts == nil {
			return total, fmt.Errorf("the store function answered without counts")
		}
		total.add(*res.Counts)
		events = events[n:]
	}
	return total, nil
}

// Advance asks the store function to move the mark.
func (r RemoteSink) Advance(ctx context.Context, endpoint string, to time.Time) error {
	_, err := r.call(ctx, StoreRequest{Op: OpAdvance, Endpoint: endpoint, To: to})
	return err
}

// InvokeBackfill invokes the deployed reconciler function with a backfill
// window and returns its summary (cmd/reconcile --stage).
func InvokeBackfill(ctx context.Context, client Invoker, function string, in Invocation) (Summary, error) {
	payload, err := json.Marshal(in)
	if err != nil {
		return Summary{}, err
	}
	out, err := client.Invoke(ctx, &lambda.InvokeInput{
		FunctionName:   aws.String(function),
		InvocationType: types.InvocationTypeRequestResponse,
		Payload:        payload,
	})
	if err != nil {
		return Summary{}, fmt.Errorf("invoking %s: %w", function, err)
	}
	var s Summary
	if out.FunctionError != nil {
		return s, fmt.Errorf("%s failed (%s): %s", function, aws.ToString(out.FunctionError), out.Payload)
	}
	if err := json.Unmarshal(out.Payload, &s); err != nil {
		return s, fmt.Errorf("the answer of %s: %w: %.200s", function, err, out.Payload)
	}
	return s, nil
}
