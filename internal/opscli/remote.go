package opscli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/lambda/types"
	"github.com/aws/smithy-go"

	"github.com/stripe-inbox/inbox/internal/dualstack"
	"github.com/stripe-inbox/inbox/internal/invokeproof"
	"github.com/stripe-inbox/inbox/internal/ops"
)

// remote runs requests on a deployed stage: a synchronous Invoke of the
// stage's ops function (RequestResponse, the default InvocationType), which
// runs ops.Ops.Handle inside the VPC and answers the Response as JSON. The
// caller's AWS credentials sign the call (the SDK's default chain:
// environment, AWS_PROFILE and the shared files, SSO, ...), so who may run
// inboxctl against a stage is who may lambda:InvokeFunction that function.
// AWS_ENDPOINT_URL_LAMBDA (the SDK's service endpoint setting) points it at
// another endpoint, as the tests do at the Lambda runtime emulator.
//
// Each request also carries a proof of who sends it (internal/invokeproof):
// a presigned sts:GetCallerIdentity made with the same credentials and bound
// to the request's bytes. The function verifies it with STS and records the
// verified identity with every change it audits; signing is local and
// needs no permission (AWS_ENDPOINT_URL_STS and AWS_USE_DUALSTACK_ENDPOINT
// choose the STS host it is signed for, which must be the function's).
type remote struct {
	client   *lambda.Client
	signer   *invokeproof.Signer
	function string
	stage    string
}

// invokeTimeout bounds one call; the function's own timeout is shorter.
const invokeTimeout = 2 * time.Minute

func newRemote(ctx context.Context, stage string) (transport, error) {
	cfg, err := dualstack.Load(ctx)
	if err != nil {
		return nil, &ops.Error{Kind: ops.KindInvalid, Message: fmt.Sprintf("reading the AWS configuration: %v; check AWS_PROFILE and ~/.aws/config", err)}
	}
	if cfg.Region == "" {
		return nil, &ops.Error{Kind: ops.KindInvalid, Message: "no AWS region: set AWS_REGION (or AWS_PROFILE with a region) to the region the stage is deployed in"}
	}
	// Fail early, and clearly, without credentials: the SDK's own error
	// names every provider it tried.
	if _, err := cfg.Credentials.Retrieve(ctx); err != nil {
		return nil, &ops.Error{Kind: ops.KindInvalid, Message: "no AWS credentials: sign in (aws sso login, or AWS_PROFILE, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY) as someone allowed lambda:InvokeFunction on " +
			ops.FunctionName(stage) + "; the SDK said: " + firstLine(err.Error())}
	}
	return &remote{client: lambda.NewFromConfig(cfg), signer: invokeproof.NewSigner(cfg), function: ops.FunctionName(stage), stage: stage}, nil
}

func (r *remote) close() {}

func (r *remote) do(ctx context.Context, req ops.Request) (ops.Response, error) {
	env, err := r.signer.Sign(ctx, ops.Audience, req)
	if err != nil {
		return ops.Response{}, err
	}
	payload, err := json.Marshal(env)
	if err != nil {
		return ops.Response{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, invokeTimeout)
	defer cancel()
	out, err := r.client.Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String(r.function), Payload: payload})
	if err != nil {
		return ops.Response{}, r.invokeError(err)
	}
	// A failed invocation answers {"errorMessage": ..., "errorType": ...},
	// which Lambda flags with X-Amz-Function-Error (FunctionError; the
	// runtime emulator does not set it, so the body is checked too).
	var fe struct {
		Message string `json:"errorMessage"`
		Type    string `json:"errorType"`
	}
	_ = json.Unmarshal(out.Payload, &fe)
	if out.FunctionError != nil || fe.Message != "" || fe.Type != "" {
		kind := aws.ToString(out.FunctionError)
		if kind == "" {
			kind = fe.Type
		}
		msg := fe.Message
		if msg == "" {
			msg = strings.TrimSpace(string(out.Payload))
		}
		return ops.Response{}, fmt.Errorf("%s failed (%s): %s; its log group has the details", r.function, kind, msg)
	}
	var resp ops.Response
	if err := json.Unmarshal(out.Payload, &resp); err != nil || resp.Command != req.Command {
		return ops.Response{}, fmt.Errorf("%s answered %.200q, which is not an answer to %s: is the stage running this release?", r.function, out.Payload, req.Command)
	}
	if resp.Error != nil {
		return ops.Response{}, resp.Error
	}
	return resp, nil
}

// invokeError turns the Invoke API's errors an operator can fix into
// mistakes with what to do.
func (r *remote) invokeError(err error) error {
	var notFound *types.ResourceNotFoundException
	if errors.As(err, &notFound) {
		return &ops.Error{Kind: ops.KindNotFound, Message: fmt.Sprintf("stage %q has no ops function %s in this account and region: check --stage, AWS_REGION and AWS_PROFILE (the stack's output OpsFunctionName names it)", r.stage, r.function)}
	}
	var api smithy.APIError
	if errors.As(err, &api) {
		switch api.ErrorCode() {
		case "AccessDeniedException", "AccessDenied", "UnrecognizedClientException", "InvalidSignatureException", "ExpiredTokenException":
			return &ops.Error{Kind: ops.KindInvalid, Message: fmt.Sprintf("AWS refused the call (%s): your credentials need lambda:InvokeFunction on %s (and must be current): %s", api.ErrorCode(), r.function, api.ErrorMessage())}
		}
	}
	return fmt.Errorf("invoking %s: %w", r.function, err)
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
