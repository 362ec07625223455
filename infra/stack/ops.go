package stack

import (
	"fmt"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatch"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/jsii-runtime-go"

	"github.com/stripe-inbox/inbox/internal/ops"
)

// OpsUser is the ops function's database user: internal/approle grants it
// exactly what internal/ops runs (reads, retry, resolve, the audit row).
const OpsUser = "inbox_ops"

// maxAttempts is the worker's MAX_ATTEMPTS; the ops function gets the same,
// so that inboxctl's needs-review is the worker's.
const maxAttempts = "10"

// opsFunction is the function inboxctl --stage NAME invokes: in the VPC
// (the database is private), without a Function URL or any other trigger,
// so the only way in is lambda:InvokeFunction with IAM credentials. Its
// name is fixed (ops.FunctionName), so that inboxctl finds it from the
// stage name alone. Reserved concurrency 2: operators cannot take more
// than two proxy connections each from the functions that serve traffic.
func (b *builder) opsFunction() {
	fn := b.newFunction(function{
		name:        "ops",
		description: "inboxctl --stage: operator commands (status, receipts, show, retry, anomalies, resolve, secrets, outbox, outbox-retry), audited",
		dbUser:      OpsUser,
		timeout:     awscdk.Duration_Seconds(jsii.Number(30)),
		reserved:    jsii.Number(2),
		callsAWS:    true, // STS: the caller's proof
		env: map[string]string{
			"MAX_ATTEMPTS":       maxAttempts,
			"STRIPE_API_VERSION": b.s.StripeAPIVersion,
			"DB_MAX_CONNS":       "2",
		},
	})
	fn.Node().DefaultChild().(awslambda.CfnFunction).SetFunctionName(jsii.String(ops.FunctionName(b.s.Stage)))
	b.functions["ops"] = fn
}

// opsOutputs name the ops function and what to grant its operators.
func (b *builder) opsOutputs() {
	fn := b.functions["ops"]
	awscdk.NewCfnOutput(b.stack, jsii.String("OpsFunctionName"), &awscdk.CfnOutputProps{
		Description: jsii.String(fmt.Sprintf("inboxctl --stage %s invokes this function; operators need lambda:InvokeFunction on OpsFunctionArn", b.s.Stage)),
		Value:       fn.FunctionName(),
	})
	awscdk.NewCfnOutput(b.stack, jsii.String("OpsFunctionArn"), &awscdk.CfnOutputProps{
		Description: jsii.String("Grant operators lambda:InvokeFunction on this ARN (and nothing else is needed to run inboxctl --stage)"),
		Value:       fn.FunctionArn(),
	})
}

// driftAlarm fires when the worker counted receipts of another Stripe API
// version than the stage declares (stripeApiVersion): an endpoint was
// upgraded in the Stripe dashboard, or the setting is stale. Missing data is
// not breaching: the worker emits the count on every run, and BacklogAge
// watches a stopped worker.
func (b *builder) driftAlarm() alarmSpec {
	return alarmSpec{
		id: "ApiVersionDriftAlarm",
		description: fmt.Sprintf("Receipts arrived with another Stripe API version than %s (UnexpectedApiVersion; by Endpoint and ApiVersion on the dashboard, "+
			"inboxctl status lists versions per endpoint). Check the handlers against the new version, then set stripeApiVersion, or roll the endpoint back in the Stripe dashboard.", b.s.StripeAPIVersion),
		metric:    b.emf("worker", "UnexpectedApiVersion", "Sum"),
		threshold: 0, periods: 1, missing: awscloudwatch.TreatMissingData_NOT_BREACHING,
	}
}
