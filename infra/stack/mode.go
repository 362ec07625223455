package stack

import (
	"fmt"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatch"
	"github.com/aws/jsii-runtime-go"
)

// otherModeOnlyAlarm fires when, over an hour, the worker stored events of
// the other Stripe mode (IgnoredOtherMode) and none of the mode the stage
// books (Processed + Ignored: applied, or of a type no handler reads). That
// is the signature of a stage whose stripeMode is wrong, or of endpoints
// pointed at the wrong stage: every payment ends ignored_other_mode, final,
// and nothing else would say so. On a live Connect endpoint, connected
// accounts' test-mode events are normal, but they arrive next to live
// ones; only an hour with nothing but them fires (a very quiet live
// endpoint may see that rarely, which is worth a look anyway).
func (b *builder) otherModeOnlyAlarm() alarmSpec {
	hour := awscdk.Duration_Hours(jsii.Number(1))
	perHour := func(name string) awscloudwatch.IMetric {
		return b.emf("worker", name, "Sum").With(&awscloudwatch.MetricOptions{Period: hour})
	}
	return alarmSpec{
		id: "OtherModeOnlyAlarm",
		description: fmt.Sprintf("For an hour the worker received only events of the other Stripe mode (this stage books %s; IgnoredOtherMode > 0, "+
			"Processed + Ignored = 0). They are stored with outcome ignored_other_mode and never booked. Check stripeMode and which Stripe "+
			"endpoints (live or test) point at this stage; after fixing, re-queue those receipts (README, Operations).", b.s.StripeMode),
		metric: awscloudwatch.NewMathExpression(&awscloudwatch.MathExpressionProps{
			Expression: jsii.String("IF(other > 0 AND (applied + ignored) == 0, 1, 0)"),
			UsingMetrics: &map[string]awscloudwatch.IMetric{
				"other":   perHour("IgnoredOtherMode"),
				"applied": perHour("Processed"),
				"ignored": perHour("Ignored"),
			},
			Label:  jsii.String("only the other mode"),
			Period: hour,
		}),
		threshold: 0, periods: 1,
		// No receipts, no question about their mode.
		missing: awscloudwatch.TreatMissingData_NOT_BREACHING,
	}
}
