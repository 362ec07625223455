// Command ops is the Lambda that inboxctl --stage NAME invokes (IAM-
// authorized, synchronous): it runs one operator request (internal/ops)
// inside the VPC, as the database role inbox_ops, and answers JSON. Every
// change is written to ops_audit with this invocation's request id, and
// logged. An operator mistake is answered (Response.Error); only a failure
// fails the invocation (and the function's Errors alarm).
package main

import (
	"context"
	"os"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-lambda-go/lambdacontext"

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
	o, pool, err := bootstrap.NewOps(context.Background(), cfg, logger)
	if err != nil {
		bootstrap.Fail(logger, "ops cannot start", err)
	}
	handler := func(ctx context.Context, req ops.Request) (ops.Response, error) {
		c := ops.Caller{Actor: "lambda"}
		if req.Actor != "" {
			c.Actor = "inboxctl:" + req.Actor // as the caller says; CloudTrail has the IAM principal of RequestID
		}
		if lc, ok := lambdacontext.FromContext(ctx); ok {
			c.RequestID = lc.AwsRequestID
		}
		resp, err := o.Handle(ctx, req, c)
		if err != nil {
			logger.ErrorContext(ctx, "ops request failed", "command", req.Command, "request_id", c.RequestID, "error", err.Error())
		}
		return resp, err
	}
	lambda.StartWithOptions(handler, lambda.WithEnableSIGTERM(pool.Close))
}
