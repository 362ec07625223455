// Command infra is the CDK app of the Stripe webhook inbox. It reads the
// settings from CDK context (see stack.Settings), defines one stack for the
// stage, and runs the cdk-nag AwsSolutions checks over it, so `cdk synth`
// fails on an unsuppressed finding.
//
//	cdk synth -c stage=dev
//	cdk deploy -c stage=prod -c alarmEmail=ops@example.com
package main

import (
	"fmt"
	"os"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/jsii-runtime-go"
	"github.com/cdklabs/cdk-nag-go/cdknag/v2"

	"github.com/stripe-inbox/inbox/infra/stack"
)

func main() {
	defer jsii.Close()
	app := awscdk.NewApp(nil)
	settings, err := stack.SettingsFromContext(func(key string) any { return app.Node().TryGetContext(jsii.String(key)) })
	if err != nil {
		fail(err)
	}
	s, err := stack.NewInboxStack(app, settings.StackName(), &stack.InboxStackProps{Settings: settings})
	if err != nil {
		fail(err)
	}
	awscdk.Aspects_Of(s).Add(cdknag.NewAwsSolutionsChecks(&cdknag.NagPackProps{Verbose: jsii.Bool(true)}), nil)
	app.Synth(nil)
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "synth failed: %v\n", err)
	jsii.Close()
	os.Exit(1)
}
