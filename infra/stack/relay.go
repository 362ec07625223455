package stack

import (
	"fmt"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatch"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsevents"
	"github.com/aws/jsii-runtime-go"
)

// OutboxArchiveRetentionDays is how long the bus's archive keeps events, so
// that a consumer can replay what it missed (EventBridge "StartReplay").
const OutboxArchiveRetentionDays = 90

// OutboxBusName is the outbox relay's event bus name for a stack.
func OutboxBusName(stackName string) string { return stackName + "-outbox" }

// outboxRelay is the outbox relay's part of the stack (internal/outbox runs
// inside the worker): a custom event bus per stage, an archive on it, the
// worker's permission to put events on that bus only, and its OUTBOX_BUS.
// The worker reaches EventBridge's dual-stack host (events.REGION.api.aws)
// over IPv6 (network()); PutEvents carries no global endpoint id, which
// would send it to another host. With
// outboxRelay=false none of it exists and OUTBOX_BUS is unset (relay off).
func (b *builder) outboxRelay() {
	if !b.s.OutboxRelay {
		return
	}
	worker := b.functions["worker"]
	b.bus = awsevents.NewEventBus(b.stack, jsii.String("OutboxBus"), &awsevents.EventBusProps{
		EventBusName: jsii.String(OutboxBusName(b.s.StackName())),
		Description:  jsii.String("Stripe inbox outbox events (" + b.s.Stage + "): at least once, de-duplicate on detail.outbox_id"),
	})
	b.bus.ApplyRemovalPolicy(b.removal())
	archive := b.bus.Archive(jsii.String("OutboxArchive"), &awsevents.BaseArchiveProps{
		Description: jsii.String("Every outbox event, for replays"),
		// Every event put on the bus (all come from this account).
		EventPattern: &awsevents.EventPattern{Account: &[]*string{b.stack.Account()}},
		Retention:    awscdk.Duration_Days(jsii.Number(OutboxArchiveRetentionDays)),
	})
	archive.ApplyRemovalPolicy(b.removal())

	b.bus.GrantPutEventsTo(worker, nil) // events:PutEvents on this bus only
	worker.AddEnvironment(jsii.String("OUTBOX_BUS"), b.bus.EventBusName(), nil)
}

// outboxAlarms are the relay's alarms (README "Operations"), none when it
// is off. Both read gauges the worker writes at the end of every run; no
// data means the worker stopped reporting, which is breaching, as for the
// inbox's BacklogAge and NeedsReview.
func (b *builder) outboxAlarms() []alarmSpec {
	if b.bus == nil {
		return nil
	}
	return []alarmSpec{
		{
			id: "OutboxBacklogAgeAlarm",
			description: fmt.Sprintf("The oldest unpublished outbox row is older than %s, or the worker stopped reporting. "+
				"Read the worker's log (\"outbox: PutEvents failed\"): IAM, the bus, the route to EventBridge (IPv6 egress), or throttling. Rows are safe in the table.", b.s.BacklogAgeAlarm),
			metric:    b.emf("worker", "OutboxOldestAgeSeconds", "Maximum"),
			threshold: b.s.BacklogAgeAlarm.Seconds(),
			periods:   1,
			missing:   awscloudwatch.TreatMissingData_BREACHING,
		},
		{
			id:          "OutboxNeedsReviewAlarm",
			description: "Outbox rows used up their attempts (EventBridge refused their entries) and wait for an operator: inboxctl outbox --stage STAGE lists them with last_error; fix the cause, then inboxctl outbox-retry ID... (or --waiting) --reason TEXT --stage STAGE.",
			metric:      b.emf("worker", "OutboxNeedsReviewCount", "Maximum"), threshold: 0, periods: 1,
			missing: awscloudwatch.TreatMissingData_BREACHING,
		},
	}
}

// outboxDashboardRow adds the relay's row to the dashboard.
func (b *builder) outboxDashboardRow(d awscloudwatch.Dashboard, graph func(string, float64, ...awscloudwatch.IMetric) awscloudwatch.IWidget) {
	if b.bus == nil {
		return
	}
	d.AddWidgets(
		graph("Outbox: oldest unpublished (s), waiting for review", 12,
			b.emf("worker", "OutboxOldestAgeSeconds", "Maximum"), b.emf("worker", "OutboxNeedsReviewCount", "Maximum")),
		b.logQuery("Outbox: published, failed, throttled, failed calls, fenced, backlog (log fields)", "worker",
			"fields @timestamp | filter ispresent(OutboxPublished) or ispresent(OutboxBacklogCount)"+
				" | stats sum(OutboxPublished) as published, sum(OutboxFailed) as failed, sum(OutboxThrottled) as throttled,"+
				" sum(OutboxCallFailed) as call_failed, sum(OutboxFenced) as fenced, max(OutboxBacklogCount) as backlog by bin(5m)"+
				" | sort @timestamp desc", 12),
	)
}

// outboxOutputs are the bus's name and ARN, for consumers' rules.
func (b *builder) outboxOutputs() {
	if b.bus == nil {
		return
	}
	awscdk.NewCfnOutput(b.stack, jsii.String("OutboxBusName"), &awscdk.CfnOutputProps{Value: b.bus.EventBusName()})
	awscdk.NewCfnOutput(b.stack, jsii.String("OutboxBusArn"), &awscdk.CfnOutputProps{Value: b.bus.EventBusArn()})
}
