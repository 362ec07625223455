package stack

import (
	"path/filepath"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsevents"
	"github.com/aws/aws-cdk-go/awscdk/v2/awseventstargets"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssecretsmanager"
	"github.com/aws/jsii-runtime-go"
)

// A caller outside the VPC and its store inside (docs/design.md): the
// reconciler (reconcile.go) and the write-back sender (writeback.go) each
// are a function outside the VPC that reaches Stripe with a restricted key
// from Secrets Manager and hands every database operation to a store
// function inside the VPC (newFunction) with a synchronous, IAM-authorized
// Invoke, proven with its role (internal/storecall, internal/invokeproof).
// The helpers below build the parts they share.

// stripeKey is the Secrets Manager secret of a caller's restricted Stripe
// key, created with placeholder (not a key: the caller refuses to start
// until an operator stores one). rolled says how the caller picks up a
// rolled key (cdk-nag AwsSolutions-SMG4: Stripe, not Secrets Manager,
// rotates it).
func (b *builder) stripeKey(id, description, placeholder, rolled string) awssecretsmanager.Secret {
	key := awssecretsmanager.NewSecret(b.stack, jsii.String(id), &awssecretsmanager.SecretProps{
		Description:       jsii.String(description),
		SecretStringValue: awscdk.SecretValue_UnsafePlainText(jsii.String(placeholder)),
		RemovalPolicy:     b.removal(),
	})
	suppress(key, false, suppression{
		id: "AwsSolutions-SMG4",
		reason: "Stripe issues the restricted key and only Stripe can roll it; operators roll it in the Stripe dashboard " +
			"and store the new key (" + rolled + ")",
	})
	return key
}

// stripeCaller is a function outside the VPC that calls Stripe with key and
// invokes store.
type stripeCaller struct {
	name        string // the asset's and the function's name: StackName()-name
	description string
	timeout     float64 // seconds
	reserved    float64 // reserved concurrency
	maxEventAge awscdk.Duration
	key         awssecretsmanager.ISecret
	store       awslambda.Function
	// env is added to STRIPE_API_KEY_SECRET_ARN, STORE_FUNCTION,
	// STRIPE_MODE, METRICS_NAMESPACE and METRICS_DIMENSIONS.
	env map[string]*string
}

// newStripeCaller builds c's function, with its log group, read access to
// its key and lambda:InvokeFunction on exactly its store function,
// unqualified (it invokes it by name): no version or alias wildcard. It has
// no async retries (scheduled: the next tick covers a failed run).
func (b *builder) newStripeCaller(c stripeCaller) awslambda.Function {
	id := OutputID(c.name)
	logs := awslogs.NewLogGroup(b.stack, jsii.String(id+"Logs"), &awslogs.LogGroupProps{
		Retention:     retention(b.s.LogRetentionDays),
		RemovalPolicy: b.removal(),
	})
	env := map[string]*string{
		"STRIPE_API_KEY_SECRET_ARN": c.key.SecretArn(),
		"STORE_FUNCTION":            c.store.FunctionName(),
		"STRIPE_MODE":               jsii.String(b.s.StripeMode),
		"METRICS_NAMESPACE":         jsii.String(b.s.MetricsNamespace),
		"METRICS_DIMENSIONS":        jsii.String("Stage=" + b.s.Stage),
	}
	for k, v := range c.env {
		env[k] = v
	}
	fn := awslambda.NewFunction(b.stack, jsii.String(id+"Function"), &awslambda.FunctionProps{
		// A fixed name: operators' tools invoke StripeInbox-STAGE-name.
		FunctionName:                 jsii.String(b.s.StackName() + "-" + c.name),
		Description:                  jsii.String(c.description),
		Runtime:                      awslambda.Runtime_PROVIDED_AL2023(),
		Architecture:                 awslambda.Architecture_ARM_64(),
		Handler:                      jsii.String("bootstrap"),
		Code:                         awslambda.Code_FromAsset(jsii.String(filepath.Join(b.s.AssetsDir, c.name)), nil),
		MemorySize:                   jsii.Number(256),
		Timeout:                      awscdk.Duration_Seconds(jsii.Number(c.timeout)),
		ReservedConcurrentExecutions: jsii.Number(c.reserved),
		Environment:                  &env,
		LogGroup:                     logs,
		LoggingFormat:                awslambda.LoggingFormat_JSON,
		RetryAttempts:                jsii.Number(0),
		MaxEventAge:                  c.maxEventAge,
	})
	b.functions[c.name] = fn
	c.key.GrantRead(fn, nil)
	fn.AddToRolePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Actions:   jsii.Strings("lambda:InvokeFunction"),
		Resources: jsii.Strings(*c.store.FunctionArn()),
	}))
	return fn
}

// onlyCallerInvokes tells the store function whose proofs to admit (the
// caller's role ARN in roleEnv) and gives it a resource policy (id, with
// statement sid) that denies lambda:InvokeFunction to every principal but
// the caller's role, so a role allowed lambda:InvokeFunction on "*" is
// refused by IAM before the function runs (an explicit Deny in a
// resource-based policy overrides an identity-based Allow; Lambda accepts
// Deny statements in a function's full JSON policy,
// AWS::Lambda::ResourcePolicy,
// https://docs.aws.amazon.com/lambda/latest/dg/access-control-resource-based.html).
// The proof stays the control the function itself enforces: it holds if the
// policy is changed or removed.
func (b *builder) onlyCallerInvokes(store, caller awslambda.Function, roleEnv, id, sid string) {
	roleArn := caller.Role().RoleArn()
	store.AddEnvironment(jsii.String(roleEnv), roleArn, nil)
	awslambda.NewCfnResourcePolicy(b.stack, jsii.String(id), &awslambda.CfnResourcePolicyProps{
		ResourceArn: store.FunctionArn(),
		PolicyDocument: map[string]any{
			"Version": "2012-10-17",
			"Statement": []any{map[string]any{
				"Sid":       sid,
				"Effect":    "Deny",
				"Principal": "*",
				"Action":    "lambda:InvokeFunction",
				"Resource":  []any{store.FunctionArn(), awscdk.Fn_Join(jsii.String(""), &[]*string{store.FunctionArn(), jsii.String(":*")})},
				"Condition": map[string]any{"ArnNotEquals": map[string]any{"aws:PrincipalArn": roleArn}},
			}},
		},
	})
}

// schedule runs fn on expression, without retries: a missed tick is
// covered by the next one.
func (b *builder) schedule(id, description, expression string, enabled bool, fn awslambda.Function, maxEventAge awscdk.Duration) {
	awsevents.NewRule(b.stack, jsii.String(id), &awsevents.RuleProps{
		Description: jsii.String(description),
		Schedule:    awsevents.Schedule_Expression(jsii.String(expression)),
		Enabled:     jsii.Bool(enabled),
		Targets: &[]awsevents.IRuleTarget{awseventstargets.NewLambdaFunction(fn, &awseventstargets.LambdaFunctionProps{
			RetryAttempts: jsii.Number(0),
			MaxEventAge:   maxEventAge,
		})},
	})
}
