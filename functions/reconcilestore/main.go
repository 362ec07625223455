// Command reconcilestore is the Lambda inside the VPC that stores the pages
// of events the reconciler (outside the VPC) hands it with an IAM-authorized
// Invoke, as receipts with source 'reconcile', and keeps the reconciler's
// high-water mark (see internal/reconcile, ProvenStore and StoreHandler). It
// serves only requests proven to come from the reconciler's role
// (RECONCILER_ROLE_ARN, internal/invokeproof), and counts every other
// (InvokeProofRefused). It has no URL and no schedule.
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
	cfg, err := config.LoadReconcileStore(os.Getenv)
	if err != nil {
		bootstrap.Fail(logger, "reconcilestore cannot start", err)
	}
	h, pool, err := bootstrap.NewReconcileStore(context.Background(), cfg, logger, os.Stdout)
	if err != nil {
		bootstrap.Fail(logger, "reconcilestore cannot start", err)
	}
	lambda.StartWithOptions(h.Invoke, lambda.WithEnableSIGTERM(pool.Close))
}
