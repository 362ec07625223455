package stack

import (
	"fmt"
	"maps"
	"slices"
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
//
// Every metric read here is published by its service (METRICS_PUBLISH,
// publishMetrics) and no other: a custom metric costs $0.30 a month, so
// what no alarm or graph reads stays in the log lines only.
func (b *builder) emf(service, name, statistic string) awscloudwatch.Metric {
	if b.published == nil {
		b.published = map[string]map[string]bool{}
	}
	if b.published[service] == nil {
		b.published[service] = map[string]bool{}
	}
	b.published[service][name] = true
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

// publishMetrics tells each function which of its metrics to publish: the
// ones the alarms and the dashboard read (emf), nothing else.
func (b *builder) publishMetrics() {
	for name, fn := range b.functions {
		names := slices.Sorted(maps.Keys(b.published[name]))
		value := "none"
		if len(names) > 0 {
			value = strings.Join(names, ",")
		}
		fn.AddEnvironment(jsii.String("METRICS_PUBLISH"), jsii.String(value), nil)
	}
}

// logQuery is a dashboard widget of a CloudWatch Logs Insights query over
// a function's log group: the breakdowns (by reason, by type) that are log
// fields, not metrics. A query is billed only when the widget is viewed
// ($0.005 per GB scanned).
func (b *builder) logQuery(title, function, query string, width float64) awscloudwatch.IWidget {
	return awscloudwatch.NewLogQueryWidget(&awscloudwatch.LogQueryWidgetProps{
		Title:         jsii.String(title),
		LogGroupNames: &[]*string{b.functions[function].LogGroup().LogGroupName()},
		QueryString:   jsii.String(query),
		Width:         jsii.Number(width),
		Height:        jsii.Number(6),
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
	// An Errors alarm for each function someone must act on when it fails
	// unseen. Not for migrate (a failed run fails the deploy, which shows
	// it) nor ops (the operator who ran inboxctl reads the error).
	for _, name := range Functions {
		if name == "migrate" || name == "ops" {
			continue
		}
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
	// No throttle alarm for the worker: a burst of wakes is throttled at
	// its reserved concurrency by design (internal/wake), and a worker that
	// cannot run shows as BacklogAge. Nor for the daily purge: a throttled
	// run is retried by its rule, and one that never runs shows as
	// PurgeErrors or a growing table (DatabaseFreeStorage).
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
	specs = append(specs, b.writebackAlarms()...)
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
				graph("Webhook: store failures, rejected, URL errors", 12,
					b.emf("webhook", "StoreFailed", "Sum"), b.emf("webhook", "Rejected", "Sum"), url5xx, url4xx),
				b.logQuery("Webhook: deliveries by outcome, rejections by reason (log fields)", "webhook",
					"fields @timestamp | filter ispresent(Received) or ispresent(Duplicate) or ispresent(Rejected) or ispresent(ListedCopyReplaced)"+
						" | stats sum(Received) as received, sum(Duplicate) as duplicate, sum(ListedCopyReplaced) as replaced by bin(5m)"+
						" | sort @timestamp desc", 12),
			},
			{
				graph("Backlog: oldest unprocessed (s), needs review, anomalies", 12,
					b.emf("worker", "OldestUnprocessedAgeSeconds", "Maximum"),
					b.emf("worker", "NeedsReviewCount", "Maximum"), b.emf("worker", "AnomalyCount", "Maximum")),
				b.logQuery("Worker: processed, ignored, failed, backlog per run (log fields)", "worker",
					"fields @timestamp | filter ispresent(Processed)"+
						" | stats sum(Processed) as processed, sum(Ignored) as ignored, sum(Failed) as failed, max(BacklogCount) as backlog by bin(5m)"+
						" | sort @timestamp desc", 12),
			},
			{
				graph("Receipt to effect (s): processed_at - received_at per receipt", 24,
					b.latency("p50"), b.latency("p99"), b.latency("Maximum")),
			},
			b.reconcileRow(),
			{
				graph("Function duration (p99)", 8, durations...),
				graph("Function errors", 8, errors...),
				b.logQuery("Purge runs (log fields)", "purge",
					"fields @timestamp, PurgedReceipts, PurgedOutbox, PurgeDurationMs | filter ispresent(PurgedReceipts) | sort @timestamp desc | limit 20", 8),
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
	b.publishMetrics()
}
