package stack

import (
	"fmt"
	"strings"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatch"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatchactions"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssns"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssnssubscriptions"
	"github.com/aws/aws-cdk-go/awscdk/v2/interfaces/interfacesawscloudwatch"
	"github.com/aws/jsii-runtime-go"
)

func fiveMinutes() awscdk.Duration { return awscdk.Duration_Minutes(jsii.Number(5)) }

// emf is a metric the functions write in the Embedded Metric Format, with the
// dimensions internal/metrics stamps on it (Service, Stage).
func (b *builder) emf(service, name, statistic string) awscloudwatch.Metric {
	return awscloudwatch.NewMetric(&awscloudwatch.MetricProps{
		Namespace:  jsii.String(b.s.MetricsNamespace),
		MetricName: jsii.String(name),
		DimensionsMap: &map[string]*string{
			"Service": jsii.String(service),
			"Stage":   jsii.String(b.s.Stage),
		},
		Statistic: jsii.String(statistic),
		Period:    fiveMinutes(),
		Label:     jsii.String(name),
	})
}

// latency is the worker's ReceiptToEffectSeconds (processed_at -
// received_at, one value per processed receipt) at a percentile statistic
// such as p50 or p99.
func (b *builder) latency(statistic string) awscloudwatch.Metric {
	m := b.emf("worker", "ReceiptToEffectSeconds", statistic)
	return m.With(&awscloudwatch.MetricOptions{Label: jsii.String("receipt to effect " + statistic + " (s)")})
}

// rejected sums the webhook's Rejected metric over every Reason, and shows
// one line per reason.
func (b *builder) rejected() awscloudwatch.MathExpression {
	return awscloudwatch.NewMathExpression(&awscloudwatch.MathExpressionProps{
		Expression: jsii.String(fmt.Sprintf(
			`SEARCH('{"%s",Reason,Service,Stage} MetricName="Rejected" Service="webhook" Stage="%s"', 'Sum', 300)`,
			b.s.MetricsNamespace, b.s.Stage)),
		Label:  jsii.String("Rejected"),
		Period: fiveMinutes(),
	})
}

// alarmSpec is one alarm: what it watches and when it fires.
type alarmSpec struct {
	id          string
	description string
	metric      awscloudwatch.IMetric
	threshold   float64
	below       bool
	periods     float64
	missing     awscloudwatch.TreatMissingData
}

// monitoring defines the alarm topic, the alarms (README "Operations" says
// what each means and what to do) and the dashboard.
func (b *builder) monitoring() {
	topic := awssns.NewTopic(b.stack, jsii.String("AlarmTopic"), &awssns.TopicProps{
		DisplayName: jsii.String("Stripe inbox alarms (" + b.s.Stage + ")"),
		EnforceSSL:  jsii.Bool(true),
	})
	if b.s.AlarmEmail != "" {
		topic.AddSubscription(awssnssubscriptions.NewEmailSubscription(jsii.String(b.s.AlarmEmail), nil))
	}
	b.topicArn = topic.TopicArn()
	action := awscloudwatchactions.NewSnsAction(topic)

	webhook := b.functions["webhook"]
	sum := &awscloudwatch.MetricOptions{Statistic: jsii.String("Sum"), Period: fiveMinutes()}
	url5xx := awscloudwatch.NewMetric(&awscloudwatch.MetricProps{
		Namespace:     jsii.String("AWS/Lambda"),
		MetricName:    jsii.String("Url5xxCount"),
		DimensionsMap: &map[string]*string{"FunctionName": webhook.FunctionName()},
		Statistic:     jsii.String("Sum"),
		Period:        fiveMinutes(),
		Label:         jsii.String("Url5xxCount"),
	})
	url4xx := awscloudwatch.NewMetric(&awscloudwatch.MetricProps{
		Namespace:     jsii.String("AWS/Lambda"),
		MetricName:    jsii.String("Url4xxCount"),
		DimensionsMap: &map[string]*string{"FunctionName": webhook.FunctionName()},
		Statistic:     jsii.String("Sum"),
		Period:        fiveMinutes(),
		Label:         jsii.String("Url4xxCount"),
	})

	notBreaching := awscloudwatch.TreatMissingData_NOT_BREACHING
	specs := []alarmSpec{
		{
			id: "BacklogAgeAlarm",
			description: fmt.Sprintf("The oldest unprocessed receipt is older than %s, or the worker stopped reporting. "+
				"Check the worker's errors and logs, then the database.", b.s.BacklogAgeAlarm),
			metric:    b.emf("worker", "OldestUnprocessedAgeSeconds", "Maximum"),
			threshold: b.s.BacklogAgeAlarm.Seconds(),
			periods:   1,
			// No data means the worker is not running: that is an outage.
			missing: awscloudwatch.TreatMissingData_BREACHING,
		},
		{
			id:          "NeedsReviewAlarm",
			description: "Receipts used up their attempts and wait for an operator (needs review). Read last_error, fix, then re-queue.",
			metric:      b.emf("worker", "NeedsReviewCount", "Maximum"), threshold: 0, periods: 1,
			// The worker reports the count on every run; no data means it
			// stopped reporting, so the receipts waiting for review are
			// unknown: treat that as breaching, like BacklogAge.
			missing: awscloudwatch.TreatMissingData_BREACHING,
		},
		{
			id:          "AnomalyAlarm",
			description: "The worker found data that breaks an invariant (AnomalyCount). Investigate before it spreads.",
			metric:      b.emf("worker", "AnomalyCount", "Maximum"), threshold: 0, periods: 1,
			missing: awscloudwatch.TreatMissingData_BREACHING,
		},
		{
			id:          "WebhookStoreFailedAlarm",
			description: "The webhook verified deliveries but could not store them (StoreFailed); Stripe is retrying. Check the database and proxy.",
			metric:      b.emf("webhook", "StoreFailed", "Sum"), threshold: 0, periods: 1, missing: notBreaching,
		},
		{
			id:          "WebhookUrl5xxAlarm",
			description: "The webhook's Function URL answered 5xx (function errors, timeouts or throttles); Stripe is retrying.",
			metric:      url5xx, threshold: 0, periods: 1, missing: notBreaching,
		},
		{
			id:          "DatabaseFreeStorageAlarm",
			description: "The database has less than 2 GiB of free storage. Autoscaling should grow it; check why it cannot (max reached) or what grows.",
			metric:      b.db.MetricFreeStorageSpace(&awscloudwatch.MetricOptions{Statistic: jsii.String("Minimum"), Period: fiveMinutes()}),
			threshold:   2 * 1024 * 1024 * 1024, below: true, periods: 1, missing: notBreaching,
		},
		{
			id:          "DatabaseConnectionsAlarm",
			description: fmt.Sprintf("More than %d database connections: the proxy's pool is near max_connections.", b.s.DBConnectionsAlarm),
			metric:      b.db.MetricDatabaseConnections(&awscloudwatch.MetricOptions{Statistic: jsii.String("Maximum"), Period: fiveMinutes()}),
			threshold:   float64(b.s.DBConnectionsAlarm), periods: 2, missing: notBreaching,
		},
	}
	for _, name := range Functions {
		fn := b.functions[name]
		specs = append(specs, alarmSpec{
			id:          OutputID(name) + "ErrorsAlarm",
			description: fmt.Sprintf("The %s function failed (Errors). Read its log group.", name),
			metric:      fn.MetricErrors(sum), threshold: 0, periods: 1, missing: notBreaching,
		})
	}
	// A throttled webhook answers Stripe 429 (Stripe retries, so nothing is
	// lost yet, but deliveries are late): more deliveries at once than
	// webhookReservedConcurrency allows.
	specs = append(specs, alarmSpec{
		id: "WebhookThrottlesAlarm",
		description: fmt.Sprintf("The webhook function was throttled: more concurrent deliveries than its reserved concurrency (%d). "+
			"Stripe retries them later; if it persists, raise webhookReservedConcurrency (and check the proxy's connections).", b.s.WebhookReservedConcurrency),
		metric: webhook.MetricThrottles(sum), threshold: 0, periods: 1, missing: notBreaching,
	})
	for _, name := range []string{"worker", "purge"} {
		specs = append(specs, alarmSpec{
			id:          OutputID(name) + "ThrottlesAlarm",
			description: fmt.Sprintf("The %s function was throttled: its reserved concurrency is used up (worker: more overlapping invocations than workerReservedConcurrency, e.g. runs that do not end before their timeout) or the account's concurrency is exhausted.", name),
			metric:      b.functions[name].MetricThrottles(sum), threshold: 0, periods: 1, missing: notBreaching,
		})
	}
	specs = append(specs, b.reconcileAlarms()...)
	specs = append(specs, b.securityAlarms()...)
	if b.s.LatencyP99Alarm > 0 {
		specs = append(specs, alarmSpec{
			id: "ReceiptLatencyAlarm",
			description: fmt.Sprintf("The p99 of receipt-to-effect latency (ReceiptToEffectSeconds) was above %s for 15 minutes: "+
				"receipts wait for a worker. Check that worker invocations overlap (WorkerThrottles, WorkerErrors, Duration), then the backlog and the database.", b.s.LatencyP99Alarm),
			metric:    b.latency("p99"),
			threshold: b.s.LatencyP99Alarm.Seconds(), periods: 3,
			// No receipts, no values: not an outage (BacklogAge watches a
			// stopped worker).
			missing: notBreaching,
		})
	}
	specs = append(specs, b.driftAlarm())
	specs = append(specs, b.otherModeOnlyAlarm())
	specs = append(specs, b.outboxAlarms()...)
	specs = append(specs, b.eventBridgeAlarms()...)
	alarms := make([]interfacesawscloudwatch.IAlarmRef, 0, len(specs))
	for _, a := range specs {
		op := awscloudwatch.ComparisonOperator_GREATER_THAN_THRESHOLD
		if a.below {
			op = awscloudwatch.ComparisonOperator_LESS_THAN_THRESHOLD
		}
		alarm := awscloudwatch.NewAlarm(b.stack, jsii.String(a.id), &awscloudwatch.AlarmProps{
			AlarmName:          jsii.String(b.s.StackName() + "-" + strings.TrimSuffix(a.id, "Alarm")),
			AlarmDescription:   jsii.String(a.description),
			Metric:             a.metric,
			Threshold:          jsii.Number(a.threshold),
			ComparisonOperator: op,
			EvaluationPeriods:  jsii.Number(a.periods),
			TreatMissingData:   a.missing,
		})
		alarm.AddAlarmAction(action)
		alarm.AddOkAction(action)
		alarms = append(alarms, alarm)
	}

	b.dashboard = b.s.StackName()
	graph := func(title string, width float64, left ...awscloudwatch.IMetric) awscloudwatch.IWidget {
		return awscloudwatch.NewGraphWidget(&awscloudwatch.GraphWidgetProps{
			Title: jsii.String(title), Width: jsii.Number(width), Height: jsii.Number(6), Left: &left,
		})
	}
	durations := []awscloudwatch.IMetric{}
	errors := []awscloudwatch.IMetric{}
	for _, name := range Functions {
		fn := b.functions[name]
		durations = append(durations, fn.MetricDuration(&awscloudwatch.MetricOptions{
			Statistic: jsii.String("p99"), Period: fiveMinutes(), Label: jsii.String(name + " p99"),
		}))
		errors = append(errors, fn.MetricErrors(&awscloudwatch.MetricOptions{
			Statistic: jsii.String("Sum"), Period: fiveMinutes(), Label: jsii.String(name),
		}))
	}
	dashboard := awscloudwatch.NewDashboard(b.stack, jsii.String("Dashboard"), &awscloudwatch.DashboardProps{
		DashboardName: jsii.String(b.dashboard),
		Widgets: &[]*[]awscloudwatch.IWidget{
			{awscloudwatch.NewAlarmStatusWidget(&awscloudwatch.AlarmStatusWidgetProps{
				Title: jsii.String("Alarms"), Alarms: &alarms, Width: jsii.Number(24),
			})},
			{
				graph("Webhook: received, duplicate, replaced a listed copy, rejected (by reason)", 12,
					b.emf("webhook", "Received", "Sum"), b.emf("webhook", "Duplicate", "Sum"), b.emf("webhook", "ListedCopyReplaced", "Sum"), b.rejected()),
				graph("Webhook: store failures and URL errors", 12,
					b.emf("webhook", "StoreFailed", "Sum"), url5xx, url4xx),
			},
			{
				graph("Backlog", 12,
					b.emf("worker", "BacklogCount", "Maximum"), b.emf("worker", "OldestUnprocessedAgeSeconds", "Maximum")),
				graph("Worker outcomes", 12,
					b.emf("worker", "Processed", "Sum"), b.emf("worker", "Failed", "Sum"), b.emf("worker", "Ignored", "Sum"),
					b.emf("worker", "NeedsReviewCount", "Maximum"), b.emf("worker", "AnomalyCount", "Maximum")),
			},
			{
				graph("Receipt to effect (s): processed_at - received_at per receipt", 24,
					b.latency("p50"), b.latency("p99"), b.latency("Maximum")),
			},
			b.reconcileRow(),
			{
				graph("Function duration (p99)", 8, durations...),
				graph("Function errors", 8, errors...),
				graph("Purge", 8,
					b.emf("purge", "PurgedReceipts", "Sum"), b.emf("purge", "PurgedOutbox", "Sum"), b.emf("purge", "PurgeDurationMs", "Maximum")),
			},
			{
				graph("Database connections", 8,
					b.db.MetricDatabaseConnections(&awscloudwatch.MetricOptions{Statistic: jsii.String("Maximum"), Period: fiveMinutes()})),
				graph("Database free storage (bytes)", 8,
					b.db.MetricFreeStorageSpace(&awscloudwatch.MetricOptions{Statistic: jsii.String("Minimum"), Period: fiveMinutes()})),
				graph("Database CPU (%)", 8,
					b.db.MetricCPUUtilization(&awscloudwatch.MetricOptions{Statistic: jsii.String("Average"), Period: fiveMinutes()})),
			},
		},
	})
	b.outboxDashboardRow(dashboard, graph)
}
