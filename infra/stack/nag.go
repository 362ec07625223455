package stack

import (
	"github.com/aws/jsii-runtime-go"
	"github.com/cdklabs/cdk-nag-go/cdknag/v2"
)

// suppression is one accepted cdk-nag AwsSolutions finding and why.
type suppression struct {
	id        string
	reason    string
	appliesTo []string
}

func suppress(construct any, children bool, ss ...suppression) {
	list := make([]*cdknag.NagPackSuppression, 0, len(ss))
	for _, s := range ss {
		n := &cdknag.NagPackSuppression{Id: jsii.String(s.id), Reason: jsii.String(s.reason)}
		if len(s.appliesTo) > 0 {
			applies := make([]any, 0, len(s.appliesTo))
			for _, a := range s.appliesTo {
				applies = append(applies, a)
			}
			n.AppliesTo = &applies
		}
		list = append(list, n)
	}
	cdknag.NagSuppressions_AddResourceSuppressions(construct, &list, jsii.Bool(children))
}

// suppressNagFindings records, with a reason each, the cdk-nag AwsSolutions
// findings this stack accepts. Everything else fails `cdk synth` and the
// infra tests.
func (b *builder) suppressNagFindings() {
	for _, name := range Functions {
		suppress(b.functions[name], true, suppression{
			id: "AwsSolutions-IAM4",
			reason: "AWSLambdaBasicExecutionRole (write to its own log group) and AWSLambdaVPCAccessExecutionRole " +
				"(manage the function's ENIs, which needs ec2:*NetworkInterface* on *) are the AWS-maintained minimum for a " +
				"Lambda in a VPC; a hand-written copy would need the same wildcard and drift from AWS's updates",
			appliesTo: []string{
				"Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole",
				"Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaVPCAccessExecutionRole",
			},
		})
	}
	database := []suppression{{
		id: "AwsSolutions-RDS11",
		reason: "PostgreSQL keeps its default port 5432: the instance is in isolated subnets and its security group " +
			"admits only the RDS Proxy, so a different port would hide nothing",
	}}
	if !b.s.Protected() {
		database = append(database,
			suppression{
				id: "AwsSolutions-RDS3",
				reason: "Test-mode stage (stripeMode=test, no real money): a single-AZ instance halves the cost; every " +
					"stripeMode=live stage (and -c multiAz=true) runs Multi-AZ",
			},
			suppression{
				id: "AwsSolutions-RDS10",
				reason: "Test-mode stage (stripeMode=test, no real money): deletion protection is off so `cdk destroy` can " +
					"remove the stack; every stripeMode=live stage turns it on and snapshots on delete",
			},
		)
	}
	suppress(b.db, false, database...)
	// db.Secret() is the secret's attachment; the secret itself is the
	// instance's "Secret" child.
	suppress(b.db.Node().FindChild(jsii.String("Secret")), false, suppression{
		id: "AwsSolutions-SMG4",
		reason: "The owner (master) password is used only by RDS Proxy and the migrate function's proxy login is IAM; " +
			"rotation is an operator choice (the proxy rereads the secret, so enabling it needs no code change)",
	})
	for fn, secret := range b.userSecrets {
		suppress(secret, false, suppression{
			id: "AwsSolutions-SMG4",
			reason: "The " + fn + " role's password is read only by RDS Proxy and set by the migrate function on each deploy; " +
				"the functions log in with IAM tokens, never with this password",
		})
	}
	if b.legacySecret != nil {
		suppress(b.legacySecret, false, suppression{
			id: "AwsSolutions-SMG4",
			reason: "The earlier release's shared role's password is read only by RDS Proxy and set by the migrate function on each deploy " +
				"until the role is retired (retireLegacyAppRole=true removes this secret); the functions log in with IAM tokens",
		})
	}
	for ep, s := range b.signing {
		suppress(s, false, suppression{
			id: "AwsSolutions-SMG4",
			reason: "Stripe issues the signing secret of endpoint " + ep + " and only Stripe can roll it; operators roll it " +
				"in the Stripe dashboard and store old and new values (comma-separated) during the overlap",
		})
	}
}
