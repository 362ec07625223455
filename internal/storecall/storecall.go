// Package storecall is the pattern the reconciler and the write-back sender
// share (docs/design.md, "A caller outside the VPC, a store inside"): a
// function outside the VPC reaches Stripe, and hands each database
// operation to a store function inside the VPC in a synchronous,
// IAM-authorized Lambda Invoke, proven with the caller's role
// (internal/invokeproof).
//
//   - Caller, outside the VPC: signs the request (Prover), invokes the store
//     function, and decodes its answer or says how it failed.
//   - Proven, inside the VPC: the store function's Lambda handler. It opens
//     the proven request (Opener), refuses one that is not proven to come
//     from the admitted role (logged and counted: InvokeProofRefused, and
//     again by Reason), decodes the request strictly (unknown fields
//     refused) and hands it to the feature's Handler.
//
// Each feature keeps its own protocol (its request and response types, its
// operations and their bounds), audience and error values; only the
// plumbing is here.
package storecall

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/lambda/types"

	"github.com/stripe-inbox/inbox/internal/invokeproof"
	"github.com/stripe-inbox/inbox/internal/metrics"
)

// Invoker is the part of the Lambda client a Caller uses
// (aws-sdk-go-v2/service/lambda v1.117.0, api_op_Invoke.go).
type Invoker interface {
	Invoke(ctx context.Context, in *lambda.InvokeInput, optFns ...func(*lambda.Options)) (*lambda.InvokeOutput, error)
}

// Prover signs a request (invokeproof.Signer).
type Prover interface {
	Sign(ctx context.Context, audience string, payload any) (invokeproof.Envelope, error)
}

// Opener checks a proven request and returns its payload
// (invokeproof.Verifier, admitting the caller's role).
type Opener interface {
	Open(ctx context.Context, audience string, env invokeproof.Envelope) ([]byte, invokeproof.Identity, error)
}

// Caller invokes one store function with proven requests.
type Caller struct {
	Lambda   Invoker
	Function string // the store function's name or ARN
	// Prover proves each request as the caller's (invokeproof.Signer, with
	// the function's role credentials): the store function refuses any
	// request without it.
	Prover Prover
	// Audience is the store function's invokeproof audience.
	Audience string
	// Name is how errors name the store function ("the store function").
	Name string
	// Sender is how errors name the caller ("the reconciler").
	Sender string
}

// Call signs req, invokes the store function synchronously and decodes its
// answer into a Res. op names the request in errors.
func Call[Res any](ctx context.Context, c Caller, op string, req any) (Res, error) {
	var res Res
	if c.Prover == nil {
		return res, fmt.Errorf("%s has no prover: the store function refuses unproven requests", c.Sender)
	}
	env, err := c.Prover.Sign(ctx, c.Audience, req)
	if err != nil {
		return res, err
	}
	payload, err := json.Marshal(env)
	if err != nil {
		return res, err
	}
	out, err := c.Lambda.Invoke(ctx, &lambda.InvokeInput{
		FunctionName:   aws.String(c.Function),
		InvocationType: types.InvocationTypeRequestResponse,
		Payload:        payload,
	})
	if err != nil {
		return res, fmt.Errorf("invoking %s (%s): %w", c.Name, op, err)
	}
	if out.FunctionError != nil {
		return res, fmt.Errorf("%s failed (%s, %s): %s", c.Name, op, aws.ToString(out.FunctionError), out.Payload)
	}
	if err := json.Unmarshal(out.Payload, &res); err != nil {
		return res, fmt.Errorf("%s's answer (%s): %w: %.200s", c.Name, op, err, out.Payload)
	}
	return res, nil
}

// Guard is the store function's side: it opens a request only once Proofs
// has proven that the admitted role sent it. Anyone else who may invoke the
// function (a role with lambda:InvokeFunction on "*") is refused before the
// database is touched, and the refusal is logged and counted:
// InvokeProofRefused (alarmed), with one more line by Reason (missing,
// malformed, stale, forged, principal; see invokeproof.Reason).
type Guard struct {
	Audience string
	Proofs   Opener
	Metrics  *metrics.Emitter // may be nil
	Logger   *slog.Logger     // may be nil
	// Name is how errors name the store function ("the store function").
	Name string
	// RefusedLog is the warning logged with each refusal.
	RefusedLog string
	// ProvenLog is the debug line of each proven request (Proven).
	ProvenLog string
	// ErrRefused is wrapped, with the reason, by a refusal's error.
	ErrRefused error
	// ErrBadRequest is wrapped by the error of a payload that is not a
	// request.
	ErrBadRequest error
}

// Open verifies env's proof and decodes its payload into a Req (unknown
// fields refused), returning the verified sender.
func Open[Req any](ctx context.Context, g Guard, env invokeproof.Envelope) (Req, invokeproof.Identity, error) {
	var req Req
	if g.Proofs == nil {
		return req, invokeproof.Identity{}, fmt.Errorf("%s has no proof verifier", g.Name)
	}
	payload, id, err := g.Proofs.Open(ctx, g.Audience, env)
	if err != nil {
		reason := invokeproof.Reason(err)
		if reason == "" {
			// STS could not be asked: not the sender's fault, and not
			// counted as a refusal; the invocation fails (Errors).
			return req, id, fmt.Errorf("verifying the request's proof: %w", err)
		}
		g.refused(ctx, reason, err)
		// The caller learns the reason, not the details (logged).
		return req, id, fmt.Errorf("%w (%s)", g.ErrRefused, reason)
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, id, fmt.Errorf("%w: %v", g.ErrBadRequest, err)
	}
	return req, id, nil
}

func (g Guard) refused(ctx context.Context, reason string, err error) {
	if g.Logger != nil {
		g.Logger.WarnContext(ctx, g.RefusedLog, "reason", reason, "error", err.Error())
	}
	one := metrics.Metric{Name: "InvokeProofRefused", Value: 1, Unit: metrics.Count}
	_ = g.Metrics.Emit(nil, one)
	_ = g.Metrics.Emit(map[string]string{"Reason": reason}, one)
}

// Handler serves a store function's requests (the feature's protocol), and
// says how its Proven handler guards them.
type Handler[Req, Res any] interface {
	Handle(ctx context.Context, req Req) (Res, error)
	// Guard is the static part of the Guard: Audience, Name, RefusedLog,
	// ProvenLog, ErrRefused, ErrBadRequest.
	Guard() Guard
	// LogAttrs are the attributes of the debug line of a proven request.
	LogAttrs(req Req) []any
}

// Proven is a store function's Lambda handler: it serves a request with
// Store only once Proofs has proven that the admitted role sent it (Guard).
type Proven[Req, Res any, H Handler[Req, Res]] struct {
	Store   H
	Proofs  Opener
	Metrics *metrics.Emitter // may be nil
	Logger  *slog.Logger     // may be nil
}

// Invoke serves one invocation.
func (p Proven[Req, Res, H]) Invoke(ctx context.Context, env invokeproof.Envelope) (Res, error) {
	g := p.Store.Guard()
	g.Proofs, g.Metrics, g.Logger = p.Proofs, p.Metrics, p.Logger
	req, id, err := Open[Req](ctx, g, env)
	if err != nil {
		var zero Res
		return zero, err
	}
	if p.Logger != nil {
		p.Logger.DebugContext(ctx, g.ProvenLog, append(p.Store.LogAttrs(req), "principal", id.ARN)...)
	}
	return p.Store.Handle(ctx, req)
}
