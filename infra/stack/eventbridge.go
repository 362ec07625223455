package stack

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatch"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsevents"
	"github.com/aws/aws-cdk-go/awscdk/v2/awseventstargets"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssqs"
	"github.com/aws/jsii-runtime-go"

	"github.com/stripe-inbox/inbox/internal/config"
	"github.com/stripe-inbox/inbox/internal/ingest"
)

// Stripe's events through Amazon EventBridge (internal/ingest,
// docs/eventbridge.md). For each source the eventBridgeSources setting
// names (a Stripe event destination of type amazon_eventbridge creates the
// partner event source aws.partner/stripe.com/ed_... in this account and
// region; https://docs.stripe.com/event-destinations/eventbridge):
//
//   - a partner event bus named after the source, which completes the
//     association (AWS deletes a source not associated within 7 days);
//   - a rule on that bus matching the source, with two targets: the
//     ingest queue (the events) and the ingest function (a doorbell: the
//     function ignores the payload and drains the queue). Each target has
//     a retry policy and the dead-letter queue
//     (https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-rule-retry-policy.html,
//     https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-rule-dlq.html).
//
// The queue's policy lets only those rules send (aws:SourceArn;
// https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-use-resource-based.html)
// and the function reads the queue itself, so a principal with
// lambda:InvokeFunction cannot hand it an event. A schedule sweeps the
// queue every minute (what a doorbell's lost invocation left). The queue's
// redrive policy moves a message received IngestMaxReceives times to the
// dead-letter queue, where refusals also land with their reason; the
// dead-letter queue has an alarm.

// IngestUser is the ingest function's database user.
const IngestUser = "inbox_ingest"

// IngestMaxReceives is the queue's maxReceiveCount: a message whose store
// failed this many times (the database down for ~IngestMaxReceives
// visibility timeouts) goes to the dead-letter queue.
const IngestMaxReceives = 10

// IngestTimeout is the ingest function's timeout, in seconds; the queue's
// visibility timeout is six times it, as AWS recommends for a function
// reading a queue.
const IngestTimeout = 30

func (b *builder) eventBridge() {
	if len(b.s.EventBridgeSources) == 0 {
		return
	}
	dlq := awssqs.NewQueue(b.stack, jsii.String("IngestDeadLetterQueue"), &awssqs.QueueProps{
		Encryption:      awssqs.QueueEncryption_SQS_MANAGED,
		EnforceSSL:      jsii.Bool(true),
		RetentionPeriod: awscdk.Duration_Days(jsii.Number(14)),
		RemovalPolicy:   b.removal(),
	})
	suppress(dlq, false, suppression{id: "AwsSolutions-SQS3", reason: "this is the dead-letter queue of the ingest queue and of the rules' targets"})
	queue := awssqs.NewQueue(b.stack, jsii.String("IngestQueue"), &awssqs.QueueProps{
		Encryption:        awssqs.QueueEncryption_SQS_MANAGED,
		EnforceSSL:        jsii.Bool(true),
		RetentionPeriod:   awscdk.Duration_Days(jsii.Number(4)),
		VisibilityTimeout: awscdk.Duration_Seconds(jsii.Number(6 * IngestTimeout)),
		DeadLetterQueue:   &awssqs.DeadLetterQueue{Queue: dlq, MaxReceiveCount: jsii.Number(IngestMaxReceives)},
		RemovalPolicy:     b.removal(),
	})

	sources := make([]string, 0, len(b.s.EventBridgeSources))
	for src := range b.s.EventBridgeSources {
		sources = append(sources, src)
	}
	slices.Sort(sources)
	pairs := make([]string, 0, len(sources))
	for _, src := range sources {
		pairs = append(pairs, src+"="+b.s.EventBridgeSources[src])
	}
	fn := b.newFunction(function{
		name:        "ingest",
		description: "Stores the Stripe events EventBridge delivers (drains its SQS queue)",
		dbUser:      IngestUser,
		timeout:     awscdk.Duration_Seconds(jsii.Number(IngestTimeout)),
		reserved:    jsii.Number(2),
		env: map[string]string{
			"EVENTBRIDGE_SOURCES": strings.Join(pairs, ","),
			"INGEST_QUEUE_URL":    *queue.QueueUrl(),
			"INGEST_DLQ_URL":      *dlq.QueueUrl(),
			"DB_MAX_CONNS":        "2",
		},
		maxEventAge: awscdk.Duration_Minutes(jsii.Number(5)),
		// SQS from inside the VPC: its dual-stack endpoint over the
		// IPv6 egress every AWS caller has (callAWSOverIPv6), no
		// interface endpoint (bootstrap.NewIngest).
		callsAWS: true,
	})
	b.functions["ingest"] = fn
	b.wakesTheWorker(fn)           // its receipts start a worker run as the webhook's do
	queue.GrantConsumeMessages(fn) // ReceiveMessage, DeleteMessage, ChangeMessageVisibility, GetQueueAttributes/Url
	dlq.GrantSendMessages(fn)      // a refusal, with its reason
	b.userSecrets["ingest"].GrantRead(b.functions["migrate"], nil)
	b.functions["migrate"].AddEnvironment(jsii.String("INGEST_DB_USER"), jsii.String(IngestUser), nil)
	b.functions["migrate"].AddEnvironment(jsii.String("INGEST_DB_SECRET_ARN"), b.userSecrets["ingest"].SecretArn(), nil)
	suppress(fn, true, suppression{
		id:     "AwsSolutions-IAM4",
		reason: "AWSLambdaBasicExecutionRole and AWSLambdaVPCAccessExecutionRole, as for every function (nag.go)",
		appliesTo: []string{
			"Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole",
			"Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaVPCAccessExecutionRole",
		},
	})

	var ruleArns []*string
	for i, src := range sources {
		id := fmt.Sprintf("StripeSource%d", i+1)
		// The partner event bus must be named after the source.
		bus := awsevents.NewEventBus(b.stack, jsii.String(id+"Bus"), &awsevents.EventBusProps{
			EventSourceName: jsii.String(src),
		})
		rule := awsevents.NewRule(b.stack, jsii.String(id+"Rule"), &awsevents.RuleProps{
			Description:  jsii.String(fmt.Sprintf("Stripe events of %s (endpoint %s) to the ingest queue", src, b.s.EventBridgeSources[src])),
			EventBus:     bus,
			EventPattern: &awsevents.EventPattern{Source: jsii.Strings(src)},
		})
		rule.AddTarget(awseventstargets.NewSqsQueue(queue, &awseventstargets.SqsQueueProps{
			RetryAttempts:   jsii.Number(185), // EventBridge's maximum
			MaxEventAge:     awscdk.Duration_Hours(jsii.Number(24)),
			DeadLetterQueue: dlq,
		}))
		rule.AddTarget(awseventstargets.NewLambdaFunction(fn, &awseventstargets.LambdaFunctionProps{
			// The doorbell: a lost ring is swept by the schedule.
			RetryAttempts:   jsii.Number(2),
			MaxEventAge:     awscdk.Duration_Minutes(jsii.Number(5)),
			DeadLetterQueue: dlq,
		}))
		ruleArns = append(ruleArns, rule.RuleArn())
	}
	// Only the rules may send to the queue: NewSqsQueue grants
	// events.amazonaws.com sqs:SendMessage with aws:SourceArn of each
	// rule; this denies every other sender but the account's own
	// administrators' tools are not exempt either (the function reads, it
	// never sends to this queue).
	queue.AddToResourcePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:        jsii.String("OnlyTheStripeRules"),
		Effect:     awsiam.Effect_DENY,
		Principals: &[]awsiam.IPrincipal{awsiam.NewAnyPrincipal()},
		Actions:    jsii.Strings("sqs:SendMessage"),
		Resources:  &[]*string{queue.QueueArn()},
		Conditions: &map[string]any{
			"ArnNotEquals": map[string]any{"aws:SourceArn": ruleArns},
		},
	}))

	awsevents.NewRule(b.stack, jsii.String("IngestSweep"), &awsevents.RuleProps{
		Description: jsii.String("Drains the ingest queue (what a lost doorbell left)"),
		Schedule:    awsevents.Schedule_Rate(awscdk.Duration_Minutes(jsii.Number(1))),
		Targets: &[]awsevents.IRuleTarget{awseventstargets.NewLambdaFunction(fn, &awseventstargets.LambdaFunctionProps{
			RetryAttempts: jsii.Number(0),
			MaxEventAge:   awscdk.Duration_Minutes(jsii.Number(1)),
		})},
	})
	b.ingestDLQ = dlq
}

// eventBridgeAlarms: a message in the dead-letter queue (a refusal, a
// store failing IngestMaxReceives times, or a target EventBridge could not
// reach), and the ingest function's errors.
func (b *builder) eventBridgeAlarms() []alarmSpec {
	if b.ingestDLQ == nil {
		return nil
	}
	return []alarmSpec{{
		id: "IngestDeadLetterAlarm",
		description: "Stripe events from EventBridge are in the ingest dead-letter queue: refused (message attribute Reason: unknown_source, " +
			"not_a_stripe_event, ...; IngestRefused by reason on the dashboard), stored in vain " + fmt.Sprint(IngestMaxReceives) + " times, or not delivered " +
			"to the queue. Read them (docs/operations.md, the EventBridge runbook), fix the cause, and redrive them to the ingest queue.",
		metric: b.ingestDLQ.MetricApproximateNumberOfMessagesVisible(&awscloudwatch.MetricOptions{
			Statistic: jsii.String("Maximum"), Period: fiveMinutes(),
		}),
		threshold: 0, periods: 1, missing: awscloudwatch.TreatMissingData_NOT_BREACHING,
	}, {
		id:          "IngestErrorsAlarm",
		description: "The ingest function failed (Errors): messages were left on the queue for redelivery. Read its log group.",
		metric:      b.functions["ingest"].MetricErrors(&awscloudwatch.MetricOptions{Statistic: jsii.String("Sum"), Period: fiveMinutes()}),
		threshold:   0, periods: 1, missing: awscloudwatch.TreatMissingData_NOT_BREACHING,
	}}
}

// eventBridgeSettings reads eventBridgeSources and functionUrl.
func (r *reader) eventBridgeSettings(s *Settings) {
	s.FunctionURL = r.boolean("functionUrl", true)
	v, ok := r.raw("eventBridgeSources")
	if ok {
		s.EventBridgeSources = map[string]string{}
		var pairs map[string]string
		switch t := v.(type) {
		case map[string]any:
			pairs = map[string]string{}
			for k, e := range t {
				pairs[k] = fmt.Sprint(e)
			}
		case string:
			t = strings.TrimSpace(t)
			if strings.HasPrefix(t, "{") {
				if err := json.Unmarshal([]byte(t), &pairs); err != nil {
					r.addf("eventBridgeSources=%s: not a JSON object of source: endpoint", t)
				}
			} else if t != "" {
				env := func(k string) string {
					if k == "EVENTBRIDGE_SOURCES" {
						return t
					}
					return ""
				}
				c, err := config.LoadIngest(func(k string) string {
					switch k {
					case "INGEST_QUEUE_URL", "INGEST_DLQ_URL":
						return "https://sqs.example/1/q"
					case "DATABASE_URL":
						return "postgres://x@localhost/x"
					}
					return env(k)
				})
				if err != nil {
					r.addf("eventBridgeSources: %v", err)
				}
				pairs = c.Sources.Exact
			}
		default:
			r.addf("eventBridgeSources: %v is not an object of source: endpoint", v)
		}
		for src, ep := range pairs {
			switch {
			case !strings.HasPrefix(src, ingest.PartnerPrefix) || len(src) == len(ingest.PartnerPrefix):
				r.addf("eventBridgeSources: %q is not a Stripe partner event source (%sed_...; Stripe shows it on the event destination)", src, ingest.PartnerPrefix)
			case !config.EndpointName.MatchString(ep):
				r.addf("eventBridgeSources: source %q: endpoint %q must be lower-case letters, digits, - and _", src, ep)
			default:
				s.EventBridgeSources[src] = ep
			}
		}
	}
	if !s.FunctionURL && len(s.EventBridgeSources) == 0 {
		r.addf("functionUrl=false leaves no way in: name the stage's EventBridge sources (eventBridgeSources) or keep the Function URL")
	}
}
