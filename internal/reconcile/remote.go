package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/lambda/types"

	"github.com/stripe-inbox/inbox/internal/invokeproof"
)

// Invoker is the part of the Lambda client RemoteSink uses
// (aws-sdk-go-v2/service/lambda v1.117.0, api_op_Invoke.go).
type Invoker interface {
	Invoke(ctx context.Context, in *lambda.InvokeInput, optFns ...func(*lambda.Options)) (*lambda.InvokeOutput, error)
}

// MaxInvokeBytes keeps a store request under Lambda's 6 MB synchronous
// payload quota (https://docs.aws.amazon.com/lambda/latest/dg/gettingstarted-limits.html),
// with room for the envelope.
const MaxInvokeBytes = 5 << 20

// RemoteSink is the Sink of the reconciler outside the VPC: every call is a
// synchronous, IAM-authorized Invoke of the store function inside the VPC.
// A page too large for one payload is sent in several requests.
type RemoteSink struct {
	Lambda   Invoker
	Function string // the store function's name or ARN
	// Prover proves each request as the reconciler's (invokeproof.Signer,
	// with the function's role credentials): the store function refuses
	// any request without it.
	Prover Prover
}

// Prover signs a request (invokeproof.Signer).
type Prover interface {
	Sign(ctx context.Context, audience string, payload any) (invokeproof.Envelope, error)
}

func (r RemoteSink) call(ctx context.Context, req StoreRequest) (StoreResponse, error) {
	if r.Prover == nil {
		return StoreResponse{}, errors.New("the reconciler has no prover: the store function refuses unproven requests")
	}
	env, err := r.Prover.Sign(ctx, StoreAudience, req)
	if err != nil {
		return StoreResponse{}, err
	}
	payload, err := json.Marshal(env)
	if err != nil {
		return StoreResponse{}, err
	}
	out, err := r.Lambda.Invoke(ctx, &lambda.InvokeInput{
		FunctionName:   aws.String(r.Function),
		InvocationType: types.InvocationTypeRequestResponse,
		Payload:        payload,
	})
	if err != nil {
		return StoreResponse{}, fmt.Errorf("invoking the store function (%s): %w", req.Op, err)
	}
	if out.FunctionError != nil {
		return StoreResponse{}, fmt.Errorf("the store function failed (%s, %s): %s", req.Op, aws.ToString(out.FunctionError), out.Payload)
	}
	var res StoreResponse
	if err := json.Unmarshal(out.Payload, &res); err != nil {
		return StoreResponse{}, fmt.Errorf("the store function's answer (%s): %w: %.200s", req.Op, err, out.Payload)
	}
	return res, nil
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
