package stack

import (
	"fmt"
	"strings"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatch"
	"github.com/aws/jsii-runtime-go"

	"github.com/stripe-inbox/inbox/internal/handlers"
)

// Write-backs to Stripe (internal/writeback, docs/writebacks.md), on only
// with the writeBacks setting (default off: nothing below is created). Two
// functions, as the reconciler's (reconcile.go), because Stripe is on the
// internet and the database in isolated subnets, and the stack has no NAT
// gateway:
//
//   - writeback, outside the VPC: every minute it reads the restricted
//     Stripe key (Customers: Write) from Secrets Manager, claims due intents
//     through the store function, calls Stripe with each intent's
//     Idempotency-Key, records each outcome, and emits the backlog's gauges.
//   - writebackstore, inside the VPC: claims and records through RDS Proxy
//     as WritebackUser (SELECT and UPDATE of the sender's columns of
//     writeback_intents, nothing else). It serves only requests proven to
//     come from the writeback function's role (internal/invokeproof), and
//     its resource policy denies everyone else lambda:InvokeFunction.
//
// The worker records the intents (WRITEBACKS on its environment).

// WritebackUser is the write-back store function's database user.
const WritebackUser = "inbox_writeback"

// WritebackKeyPlaceholder is the initial text of the write-back key's
// secret: not a key, so the writeback function refuses to start (and
// WritebackErrors fires) until an operator stores one. Never change it.
const WritebackKeyPlaceholder = "PLACEHOLDER: store a Stripe restricted key with Customers: Write (rk_...) here with aws secretsmanager put-secret-value"

// WritebackTimeout is the writeback function's timeout (seconds); its run
// stops claiming WritebackDeadlineMargin before it. A run never overlaps
// the next minute's (reserved concurrency 1); the lease (2 minutes) covers
// a claim whose run ends early.
const WritebackTimeout = 60

// WritebackDeadlineMargin is the writeback function's DEADLINE_MARGIN: more
// than one call's timeout (20s), so a call in flight ends before the
// function does.
const WritebackDeadlineMargin = "25s"

// WritebackOldestAgeAlarm is the age (seconds) of the oldest pending intent
// above which WritebacksWaitingAlarm fires.
const WritebackOldestAgeAlarm = 3600

func (b *builder) writeBacks() {
	if len(b.s.WriteBacks) == 0 {
		return
	}
	key := b.stripeKey("StripeWritebackKey", "Stripe restricted API key (rk_...) with Customers: Write, for the write-back sender",
		WritebackKeyPlaceholder, "the writeback function reads it at each cold start, and again when Stripe refuses it")

	store := b.newFunction(function{
		name:        "writebackstore",
		description: "Claims and records the write-back sender's intents (IAM-authorized invoke, proven by the sender's role)",
		dbUser:      WritebackUser,
		timeout:     awscdk.Duration_Seconds(jsii.Number(30)),
		// One sender run at a time, one request at a time; two for a
		// cold start overlapping a warm one.
		reserved: jsii.Number(2),
		callsAWS: true, // STS: the sender's proof
		env:      map[string]string{"DB_MAX_CONNS": "2"},
	})
	b.functions["writebackstore"] = store
	b.userSecrets["writeback"].GrantRead(b.functions["migrate"], nil)
	b.functions["migrate"].AddEnvironment(jsii.String("WRITEBACK_DB_USER"), jsii.String(WritebackUser), nil)
	b.functions["migrate"].AddEnvironment(jsii.String("WRITEBACK_DB_SECRET_ARN"), b.userSecrets["writeback"].SecretArn(), nil)

	fn := b.newStripeCaller(stripeCaller{
		name:        "writeback",
		description: "Sends the write-backs to Stripe exactly once (outside the VPC; its store is the writebackstore function)",
		timeout:     WritebackTimeout,
		// One run at a time: a tick that finds one running is throttled
		// and dropped (RetryAttempts 0); the next minute's runs.
		reserved:    1,
		maxEventAge: awscdk.Duration_Minutes(jsii.Number(1)),
		key:         key,
		store:       store,
		env:         map[string]*string{"DEADLINE_MARGIN": jsii.String(WritebackDeadlineMargin)},
	})
	suppress(fn, true, suppression{
		id:        "AwsSolutions-IAM4",
		reason:    "AWSLambdaBasicExecutionRole (write to its own log group), the AWS-maintained minimum, as for every function (nag.go)",
		appliesTo: []string{"Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole"},
	})
	suppress(store, true, suppression{
		id:     "AwsSolutions-IAM4",
		reason: "AWSLambdaBasicExecutionRole and AWSLambdaVPCAccessExecutionRole, as for every function (nag.go)",
		appliesTo: []string{
			"Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole",
			"Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaVPCAccessExecutionRole",
		},
	})

	// The store admits only the sender's proofs, and its resource policy
	// denies every other principal (as the reconciler's store).
	b.onlyCallerInvokes(store, fn, "WRITEBACK_ROLE_ARN", "WritebackstoreInvokers", "OnlyTheWritebackSenderInvokes")

	b.schedule("WritebackSchedule", "Sends the due write-backs to Stripe", "rate(1 minute)", true, fn, awscdk.Duration_Minutes(jsii.Number(1)))

	// The worker records the intents in the booking's transaction.
	b.functions["worker"].AddEnvironment(jsii.String("WRITEBACKS"), jsii.String(strings.Join(b.s.WriteBacks, ",")), nil)

	awscdk.NewCfnOutput(b.stack, jsii.String("StripeWritebackKeySecretArn"), &awscdk.CfnOutputProps{
		Description: jsii.String("Put a Stripe restricted key with Customers: Write (rk_...) into this secret"),
		Value:       key.SecretArn(),
	})
}

// writebackAlarms: intents waiting too long, intents waiting for a human,
// the functions' errors, and a request to the store that was not the
// sender's. None when write-backs are off.
func (b *builder) writebackAlarms() []alarmSpec {
	if len(b.s.WriteBacks) == 0 {
		return nil
	}
	notBreaching := awscloudwatch.TreatMissingData_NOT_BREACHING
	sum := &awscloudwatch.MetricOptions{Statistic: jsii.String("Sum"), Period: fiveMinutes()}
	return []alarmSpec{
		{
			id: "WritebacksWaitingAlarm",
			description: fmt.Sprintf("A write-back to Stripe has been pending for more than %s (WritebacksOldestAgeSeconds): the sender is not getting it done. "+
				"Read the writeback function's log (Stripe throttling, a refused key: store a restricted key with Customers: Write; "+
				"the store function failing), then inboxctl writebacks / writeback ID (docs/writebacks.md, docs/operations.md). "+
				"Missing data is breaching: the gauge comes from every run, so no data means the sender is not running.", fmt.Sprint(WritebackOldestAgeAlarm)+"s"),
			metric:    b.emf("writeback", "WritebacksOldestAgeSeconds", "Maximum"),
			threshold: WritebackOldestAgeAlarm, periods: 3,
			missing: awscloudwatch.TreatMissingData_BREACHING,
		},
		{
			id: "WritebacksParkedAlarm",
			description: "Write-backs to Stripe are parked (WritebacksParked): Stripe refused them in a way retrying cannot fix (a 4xx: the customer is gone, " +
				"a parameter refused) or ambiguous failures used up their attempts. They wait for a human: inboxctl writebacks, writeback ID, " +
				"fix the cause, writeback-retry ID (docs/writebacks.md).",
			metric:    b.emf("writeback", "WritebacksParked", "Maximum"),
			threshold: 0, periods: 1, missing: notBreaching,
		},
		{
			id:          "WritebackErrorsAlarm",
			description: "The writeback function failed (Errors): it could not start (a placeholder or non-restricted key in StripeWritebackKeySecretArn, STRIPE_MODE) or the store function failed. Read its log group.",
			metric:      b.functions["writeback"].MetricErrors(sum), threshold: 0, periods: 1, missing: notBreaching,
		},
		{
			id:          "WritebackstoreErrorsAlarm",
			description: "The writebackstore function failed (Errors): the database, the proxy or STS. Read its log group.",
			metric:      b.functions["writebackstore"].MetricErrors(sum), threshold: 0, periods: 1, missing: notBreaching,
		},
		{
			id: "WritebackStoreRefusedAlarm",
			description: "The write-back store function refused a request not proven to come from the writeback function's role (InvokeProofRefused; " +
				"the log line \"write-back store request refused\" has the reason and the signer). Somebody else invoked it: remove their " +
				"lambda:InvokeFunction. Nothing was claimed or recorded.",
			metric:    b.emf("writebackstore", "InvokeProofRefused", "Sum"),
			threshold: 0, periods: 1, missing: notBreaching,
		},
	}
}

// writeBacksSetting reads writeBacks (default off): the write-backs the
// worker records and the sender sends (handlers.ParseWritebacks; today
// customer_metadata).
func (r *reader) writeBacksSetting(s *Settings) {
	raw := r.str("writeBacks", "off")
	s.WriteBacks = handlers.ParseWritebacks(raw)
	if err := (handlers.Options{Writebacks: s.WriteBacks}).Validate(); err != nil {
		r.addf("writeBacks: %v", err)
	}
}
