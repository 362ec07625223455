// Command ingest is the Lambda inside the VPC that stores the Stripe events
// Amazon EventBridge delivers (a Stripe event destination of type
// amazon_eventbridge): the stage's rule puts each event on an SQS queue
// only that rule may send to, and this function drains the queue
// (internal/ingest, Drainer). It is woken by the rule's second target and
// swept by a schedule; the payload of an invocation is never read, so
// invoking it cannot inject an event.
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
	cfg, err := config.LoadIngest(os.Getenv)
	if err != nil {
		bootstrap.Fail(logger, "ingest cannot start", err)
	}
	d, pool, err := bootstrap.NewIngest(context.Background(), cfg, logger, os.Stdout)
	if err != nil {
		bootstrap.Fail(logger, "ingest cannot start", err)
	}
	lambda.StartWithOptions(d.Drain, lambda.WithEnableSIGTERM(pool.Close))
}
