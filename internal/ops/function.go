package ops

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/aws/aws-lambda-go/lambdacontext"

	"github.com/stripe-inbox/inbox/internal/invokeproof"
)

// Audience is the invokeproof audience of inboxctl's requests to the ops
// function: a proof made for another function does not open them.
const Audience = "ops"

// KindUnverified: the ops function could not verify the IAM identity of
// the caller of a request it records (Request.Audited); nothing was read
// or changed.
const KindUnverified = "unverified"

// Invocation is the ops function's input: the Request in an
// invokeproof.Envelope, as inboxctl sends it ({"payload": {...request},
// "proof": {...}}), or a bare Request (the Lambda console, aws lambda
// invoke), which may only read. The two are told apart by "payload": an
// object in an envelope, a boolean (show --payload) in a bare request.
type Invocation struct {
	Request Request
	// Payload is the request's exact bytes, which the proof covers (nil
	// for a bare request).
	Payload json.RawMessage
	Proof   *invokeproof.Proof
}

// UnmarshalJSON reads either form.
func (in *Invocation) UnmarshalJSON(b []byte) error {
	var env invokeproof.Envelope
	if err := json.Unmarshal(b, &struct {
		Payload *json.RawMessage    `json:"payload"`
		Proof   **invokeproof.Proof `json:"proof"`
	}{&env.Payload, &env.Proof}); err != nil {
		return err
	}
	if p := bytes.TrimSpace(env.Payload); len(p) > 0 && p[0] == '{' {
		in.Payload, in.Proof = env.Payload, env.Proof
		return json.Unmarshal(env.Payload, &in.Request)
	}
	return json.Unmarshal(b, &in.Request)
}

// Verifier proves who sent a payload (invokeproof.Verifier).
type Verifier interface {
	Verify(ctx context.Context, audience string, payload []byte, p *invokeproof.Proof) (invokeproof.Identity, error)
}

// Function is the ops function's handler (functions/ops). IAM decides who
// may invoke it (lambda:InvokeFunction); Lambda does not tell the function
// who did (lambdacontext carries no caller identity for an IAM-authorized
// Invoke), so for a request it records (Request.Audited) it verifies the
// proof inboxctl sends: a presigned sts:GetCallerIdentity made with the
// operator's credentials and bound to the request (internal/invokeproof).
// The identity STS returns, which must be of the function's own account, is
// recorded in ops_audit (principal_arn) next to the name the operator
// claimed. Without a verifiable proof such a request is refused
// (KindUnverified); reads are served to any invoker.
type Function struct {
	Ops    *Ops
	Proofs Verifier
	// Account admits principals of this AWS account; "" means the account
	// of the invoked function's ARN (lambdacontext).
	Account string
	Logger  *slog.Logger // may be nil
}

// Invoke serves one invocation: an operator mistake or an unverified
// caller is answered in Response.Error; a failure (the database, STS) is
// returned and fails the invocation.
func (f Function) Invoke(ctx context.Context, in Invocation) (Response, error) {
	c := Caller{Actor: in.Request.Actor}
	lc, inLambda := lambdacontext.FromContext(ctx)
	if inLambda {
		c.RequestID = lc.AwsRequestID
	}
	if in.Request.Audited() {
		if err := in.Request.check(); err != nil {
			return f.Ops.Handle(ctx, in.Request, c) // answers the mistake
		}
		account := f.Account
		if account == "" && inLambda {
			account = accountOf(lc.InvokedFunctionArn)
		}
		id, err := f.identify(ctx, in, account)
		var opErr *Error
		if errors.As(err, &opErr) {
			if f.Logger != nil {
				f.Logger.WarnContext(ctx, "operator request refused: caller not verified", "command", in.Request.Command,
					"claimed_actor", c.Actor, "request_id", c.RequestID, "error", opErr.Message)
			}
			return Response{Command: in.Request.Command, Error: opErr}, nil
		}
		if err != nil {
			return Response{}, err
		}
		c.Principal = &id
	}
	return f.Ops.Handle(ctx, in.Request, c)
}

func (f Function) identify(ctx context.Context, in Invocation, account string) (invokeproof.Identity, error) {
	what := "reads customer data"
	if in.Request.Command != CmdShow {
		what = "changes the inbox"
	}
	if in.Proof == nil {
		return invokeproof.Identity{}, &Error{Kind: KindUnverified, Message: fmt.Sprintf(
			"%s %s, and the ops function records who ran it: send it with inboxctl --stage, which proves your IAM identity with your AWS credentials "+
				"(a presigned sts:GetCallerIdentity); an invocation without that proof (the console, aws lambda invoke) may only read", in.Request.Command, what)}
	}
	if f.Proofs == nil {
		return invokeproof.Identity{}, errors.New("the ops function has no proof verifier")
	}
	if account == "" {
		return invokeproof.Identity{}, errors.New("the ops function does not know its account")
	}
	id, err := f.Proofs.Verify(ctx, Audience, in.Payload, in.Proof)
	if invokeproof.Refused(err) {
		return id, &Error{Kind: KindUnverified, Message: fmt.Sprintf("%s %s, and your IAM identity could not be verified: %v", in.Request.Command, what, err)}
	}
	if err != nil {
		return id, err
	}
	if id.Account != account {
		return id, &Error{Kind: KindUnverified, Message: fmt.Sprintf("%s %s: you signed as %s, a principal of account %s; this stage is in account %s",
			in.Request.Command, what, id.ARN, id.Account, account)}
	}
	return id, nil
}

// accountOf is the account of a Lambda function ARN
// (arn:aws:lambda:REGION:ACCOUNT:function:NAME), "" for anything else.
func accountOf(arn string) string {
	parts := strings.SplitN(arn, ":", 6)
	if len(parts) != 6 || parts[0] != "arn" || parts[2] != "lambda" {
		return ""
	}
	return parts[4]
}
