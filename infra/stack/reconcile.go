package stack

import (
	"fmt"
	"slices"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatch"
	"github.com/aws/jsii-runtime-go"
)

// The reconciler (internal/reconcile): two functions, because the Stripe API
// is on the internet and the database is in isolated subnets, and the stack
// has no NAT gateway.
//
//   - reconcile, outside the VPC: every reconcileSchedule (15 minutes) it
//     reads the restricted Stripe key from Secrets Manager (over the
//     internet), lists events on Stripe's
//     Events API and hands each page to the store function with a
//     synchronous Lambda Invoke, authorized by IAM (lambda:InvokeFunction on
//     that one function; the store function has no URL).
//   - reconcilestore, inside the VPC: stores the pages as receipts through
//     RDS Proxy as ReconcileUser (INSERT of receipts and its high-water mark,
//     nothing else) and keeps the mark.
//
// The key's secret is created with a placeholder, as the signing secrets:
// until an operator stores a restricted key (rk_...), every run fails at
// start and ReconcileErrors fires.

// ReconcileUser is the store function's database user.
const ReconcileUser = "inbox_reconcile"

// APIKeyPlaceholder is the initial text of the Stripe API key's secret. It
// is not a key, so the reconciler refuses to run until an operator stores
// one. Never change it (a changed template value overwrites the real key).
const APIKeyPlaceholder = "PLACEHOLDER: store a Stripe restricted key with read access to events (rk_...) here with aws secretsmanager put-secret-value"

// ReconcileTimeout is the reconciler function's timeout. Its runs ask for
// no new page DEADLINE_MARGIN (20s) before it and leave the rest to the
// next run, the mark moved to the last stored page.
const ReconcileTimeout = 10 * 60

func (b *builder) reconcile() {
	b.apiKey = b.stripeKey("StripeApiKey", "Stripe restricted API key (rk_...) with read access to events, for the reconciler",
		APIKeyPlaceholder, "the reconciler reads it at each cold start, and again when Stripe answers 401")

	store := b.newFunction(function{
		name:        "reconcilestore",
		description: "Stores the pages of Stripe events the reconciler hands it (IAM-authorized invoke) as receipts",
		dbUser:      ReconcileUser,
		timeout:     awscdk.Duration_Minutes(jsii.Number(1)),
		// Two reconciler runs at most (the schedule and a backfill), one
		// page at a time each.
		reserved: jsii.Number(2),
		callsAWS: true, // STS: the reconciler's proof
		env: map[string]string{
			"RECONCILE_ENDPOINTS": b.s.ReconcileEndpoint,
			"DB_MAX_CONNS":        "2",
		},
	})
	b.functions["reconcilestore"] = store

	// cmd/reconcile --stage NAME invokes StripeInbox-NAME-reconcile.
	fn := b.newStripeCaller(stripeCaller{
		name:        "reconcile",
		description: "Lists Stripe's Events API and hands missing events to the store function (outside the VPC)",
		timeout:     ReconcileTimeout,
		// The schedule and one backfill (cmd/reconcile --stage); each
		// stays under RECONCILE_RATE requests per second.
		reserved:    2,
		maxEventAge: awscdk.Duration_Minutes(jsii.Number(10)),
		key:         b.apiKey,
		store:       store,
		env: map[string]*string{
			"RECONCILE_ENDPOINT": jsii.String(b.s.ReconcileEndpoint),
			"RECONCILE_RATE":     jsii.String("5"),
		},
	})
	// The store function admits only the reconciler: security.go
	// (storeInvokers), once every function exists.

	b.schedule("ReconcileSchedule", "Reconciles the inbox against Stripe's Events API", b.s.ReconcileSchedule, b.s.Reconcile,
		fn, awscdk.Duration_Minutes(jsii.Number(10)))

	awscdk.NewCfnOutput(b.stack, jsii.String("StripeApiKeySecretArn"), &awscdk.CfnOutputProps{
		Description: jsii.String("Put a Stripe restricted key with read access to events (rk_...) into this secret"),
		Value:       b.apiKey.SecretArn(),
	})
	awscdk.NewCfnOutput(b.stack, jsii.String("ReconcileFunctionName"), &awscdk.CfnOutputProps{
		Description: jsii.String("cmd/reconcile --stage invokes it with a backfill window"),
		Value:       fn.FunctionName(),
	})
}

// reconcileAlarms: the reconciler's Errors and Throttles come from the
// loops over Functions; this is the one that says deliveries fail.
func (b *builder) reconcileAlarms() []alarmSpec {
	specs := []alarmSpec{{
		id: "EventsFoundMissingAlarm",
		description: "The reconciler found events on Stripe's Events API that the webhook never received, and stored them " +
			"(EventsFoundMissing; the dashboard shows them by type). The worker applies them, but deliveries are failing: " +
			"check the endpoint in the Stripe dashboard (disabled? failing deliveries? subscribed to every type the handlers read?), " +
			"WebhookUrl5xx and the signing secret. SELECT event_type, source, count(*) FROM webhook_inbox WHERE listed_first OR source = 'reconcile' GROUP BY 1, 2 " +
			"(source webhook: the endpoint delivered it later, and its copy replaced the listed one).",
		metric:    b.emf("reconcile", "EventsFoundMissing", "Sum"),
		threshold: 0, periods: 1, missing: awscloudwatch.TreatMissingData_NOT_BREACHING,
	}, {
		id: "ReconcileBeyondHorizonAlarm",
		description: "The reconciler's mark is older than the Events API's 30 days (ReconcileWindowClamped; ReconcileMarkAgeSeconds on the dashboard): " +
			"events created in the gap can no longer be listed, and any the webhook missed then are not repaired. Compare the gap with the Stripe dashboard " +
			"(Developers, Events; the endpoint's failed deliveries) and book what is missing by hand (docs/operations.md).",
		metric:    b.emf("reconcile", "ReconcileWindowClamped", "Maximum"),
		threshold: 0, periods: 1, missing: awscloudwatch.TreatMissingData_NOT_BREACHING,
	}}
	// Every run reports ReconcileFailed (0 or 1), failed or not. No report
	// for two schedule periods means the reconciler is not running (the
	// rule, the function's start, a throttle): missing events would go
	// unrepaired, so that is breaching. Only for a rate(...) schedule that
	// is enabled.
	if period, ok := SchedulePeriod(b.s.ReconcileSchedule); ok && b.s.Reconcile {
		window := 2 * period
		specs = append(specs, alarmSpec{
			id: "ReconcileStaleAlarm",
			description: fmt.Sprintf("The reconciler reported no run for %s (two periods of %s): events Stripe never delivered are not being repaired. "+
				"Check ReconcileErrors and the reconcile function's log (a placeholder key refuses to start), and the ReconcileSchedule rule.", window, b.s.ReconcileSchedule),
			metric: b.emf("reconcile", "ReconcileFailed", "SampleCount").With(&awscloudwatch.MetricOptions{
				Period: awscdk.Duration_Seconds(jsii.Number(window.Seconds())),
			}),
			threshold: 1, below: true, periods: 1, missing: awscloudwatch.TreatMissingData_BREACHING,
		})
	}
	return specs
}

// reconcileRow is the dashboard's reconciler row.
func (b *builder) reconcileRow() *[]awscloudwatch.IWidget {
	graph := func(title string, left ...awscloudwatch.IMetric) awscloudwatch.IWidget {
		return awscloudwatch.NewGraphWidget(&awscloudwatch.GraphWidgetProps{
			Title: jsii.String(title), Width: jsii.Number(12), Height: jsii.Number(6), Left: &left,
		})
	}
	return &[]awscloudwatch.IWidget{
		graph("Reconciler: events found missing, failed runs, window cut at 30 days",
			b.emf("reconcile", "EventsFoundMissing", "Sum"), b.emf("reconcile", "ReconcileFailed", "Sum"),
			b.emf("reconcile", "ReconcileWindowClamped", "Maximum")),
		b.logQuery("Reconciler: pages, events listed, already present, found missing by type, age of the mark (log fields)", "reconcile",
			"fields @timestamp, ReconcilePages, ReconcileEvents, ReconcileAlreadyPresent, EventsFoundMissing, EventType, ReconcileMarkAgeSeconds"+
				" | filter ispresent(ReconcilePages) or ispresent(EventType) | sort @timestamp desc | limit 50", 12),
	}
}

// reconcileSettings reads reconcile (default true: the schedule is
// enabled), reconcileSchedule (default rate(15 minutes)) and
// reconcileEndpoint (default the first endpoint; one of endpoints).
func (r *reader) reconcileSettings(s *Settings) {
	s.Reconcile = r.boolean("reconcile", true)
	s.ReconcileSchedule = r.str("reconcileSchedule", "rate(15 minutes)")
	if !schedule.MatchString(s.ReconcileSchedule) {
		r.addf("reconcileSchedule=%q: must be an EventBridge schedule expression, rate(...) or cron(...)", s.ReconcileSchedule)
	}
	def := "billing"
	if len(s.Endpoints) > 0 {
		def = s.Endpoints[0]
	}
	s.ReconcileEndpoint = r.str("reconcileEndpoint", def)
	if !slices.Contains(s.Endpoints, s.ReconcileEndpoint) {
		r.addf("reconcileEndpoint=%q: must be one of the endpoints %v (the Connect endpoint's events, of connected accounts, are not reconciled)", s.ReconcileEndpoint, s.Endpoints)
	}
}
