// Command writebackstore is the Lambda inside the VPC that serves the
// write-back sender's store operations (claim due intents, record outcomes,
// read the backlog; see internal/writeback, ProvenStore and StoreHandler)
// for the writeback function outside the VPC, which hands them over with an
// IAM-authorized Invoke. It serves only requests proven to come from the
// writeback function's role (WRITEBACK_ROLE_ARN, internal/invokeproof), and
// counts every other (InvokeProofRefused). It connects as inbox_writeback.
// It has no URL and no schedule.
package main

import (
	"context"
	"os"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/stripe-inbox/inbox/internal/bootstrap"
	"github.com/stripe-inbox/inbox/internal/config"
)

func main() {
	logger := bootstrap.Logger(os.Stdout)
	cfg, err := config.LoadWritebackStore(os.Getenv)
	if err != nil {
		bootstrap.Fail(logger, "writebackstore cannot start", err)
	}
	h, pool, err := bootstrap.NewWritebackStore(context.Background(), cfg, logger, os.Stdout)
	if err != nil {
		bootstrap.Fail(logger, "writebackstore cannot start", err)
	}
	lambda.StartWithOptions(h.Invoke, lambda.WithEnableSIGTERM(pool.Close))
}
