// Command ops is the Lambda that inboxctl --stage NAME invokes (IAM-
// authorized, synchronous): it runs one operator request (internal/ops)
// inside the VPC, as the database role inbox_ops, and answers JSON. Every
// change (and every read of a payload) is written to ops_audit with the
// caller's IAM identity as STS verified it (ops.Function), this
// invocation's request id, and the name the caller claimed, and logged. An
// operator mistake is answered (Response.Error); only a failure fails the
// invocation (and the function's Errors alarm).
package main

import (
	"context"
	"os"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/stripe-inbox/inbox/internal/bootstrap"
	"github.com/stripe-inbox/inbox/internal/config"
	"github.com/stripe-inbox/inbox/internal/ops"
)

func main() {
	logger := bootstrap.Logger(os.Stdout)
	cfg, err := config.LoadOps(os.Getenv)
	if err != nil {
		bootstrap.Fail(logger, "ops cannot start", err)
	}
	fn, pool, err := bootstrap.NewOps(context.Background(), cfg, logger)
	if err != nil {
		bootstrap.Fail(logger, "ops cannot start", err)
	}
	handler := func(ctx context.Context, in ops.Invocation) (ops.Response, error) {
		resp, err := fn.Invoke(ctx, in)
		if err != nil {
			logger.ErrorContext(ctx, "ops request failed", "command", in.Request.Command, "error", err.Error())
		}
		return resp, err
	}
	lambda.StartWithOptions(handler, lambda.WithEnableSIGTERM(pool.Close))
}
